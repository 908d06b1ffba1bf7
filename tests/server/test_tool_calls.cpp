// Tool calling, reasoning and the request fields around them, against real replica processes: tools reach
// the prompt through the chat template (or a parser's format), answers come back as tool_calls whole and
// streamed, tool_choice and the flags decide as vLLM does, and unimplemented OpenAI fields are refused.
#include <doctest/doctest.h>

#include <chrono>

#include "../router_integration/router_fixture.h"
#include "replica_fixture.h"
#include "tool_model.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

const char* weather_tools = R"([{"type":"function","function":{"name":"get_weather","description":"Weather of a city",
  "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
  {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}}}}}])";

std::string chat_body(const std::string& extra) {
  return R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"temperature":0)" +
         (extra.empty() ? std::string() : "," + extra) + "}";
}

std::string bias(int token) { return R"("logit_bias":{")" + std::to_string(token) + R"(":100})"; }

json::object answer(const http::Response& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  return json::parse(r.body).as_object();
}

// The data events of an SSE body, [DONE] last.
std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const std::size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

void check_error(const http::Response& r, const char* param) {
  INFO(r.body);
  CHECK(r.status == 400);
  CHECK(json::parse(r.body).at("error").at("param") == param);
}

}  // namespace

TEST_CASE("tool calls: hermes on Qwen's template, whole and streamed, reasoning, multi-turn") {
  test::ReplicaProcess replica({"--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"},
                               test::make_tool_qwen, "tool-qwen");
  const std::string tools = std::string(R"("tools":)") + weather_tools;

  SUBCASE("tools reach the prompt") {
    const auto without = answer(replica.post("/v1/chat/completions", chat_body(R"("max_tokens":1)")));
    const auto with = answer(replica.post("/v1/chat/completions", chat_body(tools + R"(,"max_tokens":1)")));
    CHECK(with.at("usage").at("prompt_tokens").as_int64() > without.at("usage").at("prompt_tokens").as_int64() + 40);
  }

  SUBCASE("a call comes back as tool_calls, with created the request's time") {
    const auto before = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const auto a = answer(replica.post("/v1/chat/completions", chat_body(tools + "," + bias(test::call_token) + R"(,"max_tokens":1)")));
    const auto after = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    CHECK(a.at("created").as_int64() >= before);
    CHECK(a.at("created").as_int64() <= after);
    const auto& choice = a.at("choices").at(0);
    CHECK(choice.at("finish_reason") == "tool_calls");
    const auto& message = choice.at("message");
    CHECK(message.at("content").is_null());
    const auto& call = message.at("tool_calls").at(0);
    CHECK(call.at("type") == "function");
    CHECK(std::string(call.at("id").as_string()).starts_with("call_"));
    CHECK(call.at("function").at("name") == "get_weather");
    CHECK(json::parse(call.at("function").at("arguments").as_string()) == json::parse(R"({"city": "Paris"})"));
  }

  SUBCASE("parallel calls, and parallel_tool_calls false keeps the first") {
    auto a = answer(replica.post("/v1/chat/completions", chat_body(tools + "," + bias(test::two_calls_token) + R"(,"max_tokens":1)")));
    CHECK(a.at("choices").at(0).at("message").at("tool_calls").as_array().size() == 2);
    a = answer(replica.post("/v1/chat/completions",
                            chat_body(tools + "," + bias(test::two_calls_token) + R"(,"max_tokens":1,"parallel_tool_calls":false)")));
    CHECK(a.at("choices").at(0).at("message").at("tool_calls").as_array().size() == 1);
  }

  SUBCASE("streamed: the OpenAI tool-call deltas, no markup as content, finish_reason and [DONE]") {
    const auto r = replica.post("/v1/chat/completions",
                                chat_body(tools + "," + bias(test::call_token) + R"(,"max_tokens":1,"stream":true)"));
    REQUIRE(r.status == 200);
    const auto ev = events(r.body);
    REQUIRE(ev.size() >= 4);
    CHECK(ev.back() == "[DONE]");
    std::string content, arguments, name, id, finish;
    for (std::size_t i = 0; i + 1 < ev.size(); ++i) {
      const auto c = json::parse(ev[i]).at("choices").at(0).as_object();
      const auto& d = c.at("delta").as_object();
      if (const auto* t = d.if_contains("content"); t && t->is_string()) content += t->as_string();
      if (const auto* calls = d.if_contains("tool_calls")) {
        const auto& call = calls->at(0).as_object();
        CHECK(call.at("index") == 0);
        if (call.contains("id")) {
          CHECK(name.empty());
          id = call.at("id").as_string();
          name = call.at("function").at("name").as_string();
          CHECK(call.at("type") == "function");
          CHECK(call.at("function").at("arguments") == "");
        }
        arguments += call.at("function").at("arguments").as_string();
      }
      if (c.at("finish_reason").is_string()) finish = c.at("finish_reason").as_string();
    }
    CHECK(content.empty());
    CHECK(id.starts_with("call_"));
    CHECK(name == "get_weather");
    CHECK(json::parse(arguments) == json::parse(R"({"city": "Paris"})"));
    CHECK(finish == "tool_calls");
  }

  SUBCASE("reasoning_content, whole and streamed") {
    const auto a = answer(replica.post("/v1/chat/completions", chat_body(bias(test::think_token) + R"(,"max_tokens":1)")));
    const auto& m = a.at("choices").at(0).at("message");
    CHECK(m.at("reasoning_content") == "\nThe user wants the weather.\n");
    CHECK(m.at("content") == "\n\nIt is sunny.");
    const auto r = replica.post("/v1/chat/completions", chat_body(bias(test::think_token) + R"(,"max_tokens":1,"stream":true)"));
    std::string reasoning, content;
    for (const auto& e : events(r.body)) {
      if (e == "[DONE]") continue;
      const json::value chunk = json::parse(e);
      const auto& d = chunk.at("choices").at(0).at("delta").as_object();
      if (const auto* t = d.if_contains("reasoning_content")) reasoning += t->as_string();
      if (const auto* t = d.if_contains("content")) content += t->as_string();
    }
    CHECK(reasoning == "\nThe user wants the weather.\n");
    CHECK(content == "\n\nIt is sunny.");
  }

  SUBCASE("multi-turn: the assistant's calls (arguments as an object) and the tool's result reach the template") {
    const std::string body = std::string(R"({"model":"tool-qwen","tools":)") + weather_tools + R"(,"messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"sunny, 24C"}]})";
    const auto tok = answer(replica.post("/tokenize", body));
    json::array ids = tok.at("tokens").as_array();
    const auto text = answer(replica.post("/detokenize", json::serialize(json::object{{"tokens", ids}})));
    const std::string prompt(text.at("prompt").as_string());
    CHECK(prompt.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>") !=
          std::string::npos);
    CHECK(prompt.find("<tool_response>\nsunny, 24C\n</tool_response>") != std::string::npos);
    const auto chat = replica.post("/v1/chat/completions", body.substr(0, body.size() - 1) + R"(,"max_tokens":2})");
    CHECK(chat.status == 200);
  }

  SUBCASE("tool_choice and the legacy functions") {
    auto a = answer(replica.post("/v1/chat/completions",
                                 chat_body(tools + "," + bias(test::call_token) + R"(,"max_tokens":1,"tool_choice":"none")")));
    CHECK(a.at("choices").at(0).at("message").at("content") == json::value(test::call_text));  // not parsed
    CHECK(a.at("choices").at(0).at("finish_reason") == "length");
    // Forced: the grammar engine writes the call, whatever the bias asks (tests/server/test_tool_choice.cpp).
    a = answer(replica.post("/v1/chat/completions",
                            chat_body(R"("tools":[{"type":"function","function":{"name":"get_time"}}],)" + bias(test::call_token) +
                                      R"(,"max_tokens":40,"tool_choice":{"type":"function","function":{"name":"get_time"}})")));
    CHECK(a.at("choices").at(0).at("message").at("tool_calls").at(0).at("function").at("name") == "get_time");
    CHECK(a.at("choices").at(0).at("message").at("tool_calls").at(0).at("function").at("arguments") == "{}");
    check_error(replica.post("/v1/chat/completions",
                             chat_body(tools + R"(,"tool_choice":{"type":"function","function":{"name":"nope"}})")),
                "tool_choice");
    check_error(replica.post("/v1/chat/completions", chat_body(R"("tool_choice":"auto")")), "tool_choice");
    a = answer(replica.post("/v1/chat/completions",
                            chat_body(R"("functions":[{"name":"get_weather","parameters":{"type":"object"}}],"function_call":"auto",)" +
                                      bias(test::call_token) + R"(,"max_tokens":1)")));
    CHECK(a.at("choices").at(0).at("message").at("tool_calls").at(0).at("function").at("name") == "get_weather");
    check_error(replica.post("/v1/chat/completions", chat_body(tools + R"(,"functions":[{"name":"f"}])")), "functions");
  }

  SUBCASE("OpenAI fields kvfleet does not implement are refused by name; vLLM's extras are accepted") {
    check_error(replica.post("/v1/chat/completions", chat_body(R"("audio":{"voice":"alloy","format":"wav"})")), "audio");
    check_error(replica.post("/v1/chat/completions", chat_body(R"("modalities":["text","audio"])")), "modalities");
    check_error(replica.post("/v1/chat/completions", chat_body(R"("prediction":{"type":"content","content":"x"})")), "prediction");
    check_error(replica.post("/v1/chat/completions", chat_body(R"("web_search_options":{})")), "web_search_options");
    check_error(replica.post("/v1/chat/completions", chat_body(R"("store":true)")), "store");
    check_error(replica.post("/v1/completions", R"({"prompt":"a","suffix":"b"})"), "suffix");
    CHECK(replica.post("/v1/chat/completions", chat_body(R"("store":false,"metadata":{"a":"b"},"modalities":["text"],"max_tokens":1)")).status == 200);
    CHECK(replica.post("/v1/chat/completions", chat_body(R"("top_k":5,"min_p":0.1,"repetition_penalty":1.1,"max_tokens":1)")).status == 200);
  }
}

TEST_CASE("tool calls: without the flags, auto is a 400 that says what to start; none still renders the tools") {
  test::ReplicaProcess replica;
  const std::string tools = std::string(R"("tools":)") + weather_tools;
  const auto r = replica.post("/v1/chat/completions", chat_body(tools));
  check_error(r, "tool_choice");
  CHECK(r.body.find("--enable-auto-tool-choice") != std::string::npos);
  const auto none = answer(replica.post("/v1/chat/completions", chat_body(tools + R"(,"tool_choice":"none","max_tokens":1)")));
  const auto plain = answer(replica.post("/v1/chat/completions", chat_body(R"("max_tokens":1)")));
  CHECK(none.at("usage").at("prompt_tokens").as_int64() > plain.at("usage").at("prompt_tokens").as_int64());
}

TEST_CASE("tool calls: a template without a tools section gets the parser's format, or a 400 without one") {
  const auto copy_default = [](const std::filesystem::path& out) {
    std::filesystem::copy(std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default", out,
                          std::filesystem::copy_options::recursive);
  };
  const std::string tools = std::string(R"("tools":)") + weather_tools;
  const auto body = [&](const std::string& extra) {
    return R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"max_tokens":1)" + extra + "}";
  };
  {
    test::ReplicaProcess replica({"--tool-call-parser", "hermes", "--enable-auto-tool-choice"}, copy_default, "kvfleet-default");
    const auto with = answer(replica.post("/v1/chat/completions", body("," + tools)));
    const auto without = answer(replica.post("/v1/chat/completions", body("")));
    CHECK(with.at("usage").at("prompt_tokens").as_int64() > without.at("usage").at("prompt_tokens").as_int64() + 40);
  }
  test::ReplicaProcess replica({}, copy_default, "kvfleet-default");
  check_error(replica.post("/v1/chat/completions", body("," + tools + R"(,"tool_choice":"none")")), "tools");
}

TEST_CASE("tool calls: the official openai npm client, whole, streamed, parallel and multi-turn, direct and routed") {
  test::ReplicaProcess replica({"--tool-call-parser", "hermes", "--enable-auto-tool-choice"}, test::make_tool_qwen,
                               "tool-qwen");
  test::RouterProcess router({&replica});
  const std::string npm = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm";
  for (const std::string& base : {replica.base_url(), "http://127.0.0.1:" + std::to_string(router.port())}) {
    CAPTURE(base);
    const auto r = test::run_command("KVFLEET_NPM=" + npm + " node " + KVFLEET_SOURCE_DIR +
                                     "/tests/server/openai_tools_client.mjs " + base + " " +
                                     std::to_string(test::call_token) + " " + std::to_string(test::two_calls_token) + " 2>&1");
    CHECK_MESSAGE(r.status == 0, r.out);
    CHECK(r.out == "ok\n");
  }
}

TEST_CASE("tool calls: the AI SDK and LangChain clients with auto, streamed, parallel, multi-turn and reasoning, direct "
          "and routed") {
  test::ReplicaProcess replica({"--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"},
                               test::make_tool_qwen, "tool-qwen");
  test::RouterProcess router({&replica});
  const std::string npm = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm";
  for (const std::string& base : {replica.base_url(), "http://127.0.0.1:" + std::to_string(router.port())}) {
    CAPTURE(base);
    const auto r = test::run_command("KVFLEET_NPM=" + npm + " node " + KVFLEET_SOURCE_DIR + "/tests/server/agent_clients.mjs " +
                                     base + " tool-qwen " + std::to_string(test::call_token) + " " +
                                     std::to_string(test::two_calls_token) + " " + std::to_string(test::answer_token) +
                                     " '" + test::answer_text + "' " + std::to_string(test::text_call_token) + " '" +
                                     test::text_before_call + "' " + std::to_string(test::think_token) +
                                     R"( '"\nThe user wants the weather.\n"' '"\n\nIt is sunny."' 2>&1)");
    CHECK_MESSAGE(r.status == 0, r.out);
    CHECK(r.out == "ok\n");
  }
}
