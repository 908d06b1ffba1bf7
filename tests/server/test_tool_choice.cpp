// tool_choice "required" and a named function, enforced by the grammar engine: a replica process serving the
// committed default model (no tool flags, a template without a tools section) answers with calls whose
// names are the tools' and whose arguments validate against the tools' schemas, whole and streamed, directly
// and through a router; a parameters schema the grammar engine refuses is a 400 naming it.
#include <doctest/doctest.h>

#include <set>

#include "../router_integration/router_fixture.h"
#include "replica_fixture.h"
#include "tool_model.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

// Schemas whose every value is bounded (enums, short strings, bounded integers), so that any model, even a
// tiny one, ends its constrained answer well within max_tokens.
const char* tools_json = R"([
  {"type":"function","function":{"name":"get_weather","description":"Weather of a city",
    "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Rome","Oslo"]},
      "unit":{"type":"string","enum":["C","F"]}},"required":["city","unit"]}}},
  {"type":"function","function":{"name":"get_time",
    "parameters":{"type":"object","properties":{"zone":{"type":"string","maxLength":6},
      "offset":{"type":"integer","minimum":-12,"maximum":12}},"required":["zone","offset"]}}},
  {"type":"function","function":{"name":"ping"}}])";

void copy_default(const std::filesystem::path& out) {
  std::filesystem::copy(std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default", out,
                        std::filesystem::copy_options::recursive);
}

// Greedy unless `extra` sets a temperature.
std::string body(const std::string& extra) {
  const std::string greedy = extra.find("\"temperature\"") == std::string::npos ? R"("temperature":0,)" : "";
  return R"({"messages":[{"role":"user","content":"What is the weather in Paris?"}],"max_tokens":120,)" + greedy +
         R"("tools":)" + tools_json + "," + extra + "}";
}

// The arguments against the tool's schema, checked by hand (the JS client tests check them with ajv).
void check_arguments(const std::string& name, const std::string& arguments) {
  INFO(name << " " << arguments);
  const json::value v = json::parse(arguments);
  REQUIRE(v.is_object());
  const json::object& o = v.as_object();
  if (name == "get_weather") {
    CHECK(o.size() == 2);
    CHECK(std::set<std::string>{"Paris", "Rome", "Oslo"}.count(std::string(o.at("city").as_string())) == 1);
    CHECK((o.at("unit") == "C" || o.at("unit") == "F"));
  } else if (name == "get_time") {
    CHECK(o.size() == 2);
    CHECK(o.at("zone").as_string().size() <= 6);
    CHECK(o.at("offset").as_int64() >= -12);
    CHECK(o.at("offset").as_int64() <= 12);
  } else {
    CHECK(name == "ping");
    CHECK(o.empty());
  }
}

struct Call {
  std::string id, name, arguments;
};

std::vector<Call> calls_of(const http::Response& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  const json::value a = json::parse(r.body);
  const auto& choice = a.at("choices").at(0);
  CHECK(choice.at("finish_reason") == "tool_calls");
  CHECK(choice.at("message").at("content").is_null());
  std::vector<Call> out;
  for (const auto& c : choice.at("message").at("tool_calls").as_array()) {
    CHECK(c.at("type") == "function");
    out.push_back({std::string(c.at("id").as_string()), std::string(c.at("function").at("name").as_string()),
                   std::string(c.at("function").at("arguments").as_string())});
    CHECK(out.back().id.starts_with("call_"));
  }
  return out;
}

// A streamed answer's calls, from OpenAI's tool-call deltas (id, type and name first, then arguments).
std::vector<Call> streamed_calls(const http::Response& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  std::vector<Call> out;
  std::string finish;
  bool done = false;
  for (std::size_t at = 0; (at = r.body.find("data: ", at)) != std::string::npos;) {
    const std::size_t end = r.body.find("\n\n", at);
    const std::string data = r.body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const json::value chunk = json::parse(data);
    const auto& c = chunk.at("choices").at(0).as_object();
    const auto& d = c.at("delta").as_object();
    if (const auto* t = d.if_contains("content"); t && t->is_string()) CHECK(t->as_string().empty());
    if (const auto* calls = d.if_contains("tool_calls"))
      for (const auto& call : calls->as_array()) {
        const auto index = static_cast<std::size_t>(call.at("index").as_int64());
        if (call.as_object().contains("id")) {
          REQUIRE(index == out.size());
          CHECK(call.at("type") == "function");
          out.push_back({std::string(call.at("id").as_string()), std::string(call.at("function").at("name").as_string()), ""});
        }
        REQUIRE(index < out.size());
        out[index].arguments += call.at("function").at("arguments").as_string();
      }
    if (c.at("finish_reason").is_string()) finish = c.at("finish_reason").as_string();
  }
  CHECK(done);
  CHECK(finish == "tool_calls");
  return out;
}

void check_error(const http::Response& r, const std::string& param) {
  INFO(r.body);
  CHECK(r.status == 400);
  CHECK(json::parse(r.body).at("error").at("param") == json::value(param));
}

const char* named(const char* fn) {
  static std::string s;
  s = std::string(R"("tool_choice":{"type":"function","function":{"name":")") + fn + "\"}}";
  return s.c_str();
}

}  // namespace

TEST_CASE("tool_choice required and named on the default model, whole, streamed and through a router") {
  test::ReplicaProcess replica({}, copy_default, "kvfleet-default");

  SUBCASE("named: one call of that function, its arguments valid") {
    for (const char* fn : {"get_weather", "get_time", "ping"}) {
      const auto calls = calls_of(replica.post("/v1/chat/completions", body(named(fn))));
      REQUIRE(calls.size() == 1);
      CHECK(calls[0].name == fn);
      check_arguments(calls[0].name, calls[0].arguments);
      const auto streamed = streamed_calls(replica.post("/v1/chat/completions", body(std::string(named(fn)) + R"(,"stream":true)")));
      REQUIRE(streamed.size() == 1);
      CHECK(streamed[0].name == fn);
      CHECK(streamed[0].arguments == calls[0].arguments);  // greedy: the same answer
    }
  }

  SUBCASE("required: a call of one of the tools, valid (one with parallel_tool_calls false)") {
    const auto one = calls_of(replica.post("/v1/chat/completions", body(R"("tool_choice":"required","parallel_tool_calls":false)")));
    REQUIRE(one.size() == 1);
    check_arguments(one[0].name, one[0].arguments);
    // Parallel calls: this tiny model keeps listing calls until max_tokens; the ones it completed stream out.
    const auto r = replica.post("/v1/chat/completions", body(R"("tool_choice":"required","stream":true)"));
    REQUIRE(r.status == 200);
    CHECK(r.body.find(R"("finish_reason":"tool_calls")") != std::string::npos);
    const auto streamed = streamed_calls(
        replica.post("/v1/chat/completions", body(R"("tool_choice":"required","parallel_tool_calls":false,"stream":true)")));
    REQUIRE(streamed.size() == 1);
    CHECK(streamed[0].name == one[0].name);
    CHECK(json::parse(streamed[0].arguments) == json::parse(one[0].arguments));
  }

  SUBCASE("sampled answers validate too") {
    for (int seed = 0; seed < 4; ++seed) {
      const std::string s = R"("temperature":1.0,"seed":)" + std::to_string(seed);
      for (const auto& c : calls_of(replica.post("/v1/chat/completions", body(s + R"(,"tool_choice":"required","parallel_tool_calls":false)"))))
        check_arguments(c.name, c.arguments);
      const auto c = calls_of(replica.post("/v1/chat/completions", body(s + "," + named("get_time"))));
      REQUIRE(c.size() == 1);
      check_arguments(c[0].name, c[0].arguments);
    }
  }

  SUBCASE("a parameters schema the grammar engine refuses is a 400 naming it; two constraints are a 400") {
    const std::string bad = R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"}}}}},{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"n":{"type":"integer","multipleOf":3}}}}}])";
    const auto with_bad = [&](const std::string& extra) {
      return R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":20,"tools":)" + bad + "," + extra + "}";
    };
    check_error(replica.post("/v1/chat/completions", with_bad(named("f"))), "tools[1].function.parameters.properties.n.multipleOf");
    check_error(replica.post("/v1/chat/completions", with_bad(R"("tool_choice":"required")")),
                "tools[1].function.parameters.properties.n.multipleOf");
    CHECK(replica.post("/v1/chat/completions", with_bad(named("get_weather"))).status == 200);
    check_error(replica.post("/v1/chat/completions", body(R"("tool_choice":"required","response_format":{"type":"json_object"})")),
                "response_format");
    check_error(replica.post("/v1/chat/completions", body(named("nope"))), "tool_choice");
    check_error(replica.post("/v1/chat/completions", body(R"("tool_choice":"auto")")), "tool_choice");  // no flags
  }

  SUBCASE("through a router: the same calls, whole and streamed") {
    test::RouterProcess router({&replica});
    const auto direct = calls_of(replica.post("/v1/chat/completions", body(named("get_weather"))));
    const auto routed = calls_of(router.post("/v1/chat/completions", body(named("get_weather"))));
    REQUIRE(routed.size() == 1);
    CHECK(routed[0].name == "get_weather");
    CHECK(routed[0].arguments == direct.at(0).arguments);
    const auto streamed = streamed_calls(
        router.post("/v1/chat/completions", body(R"("tool_choice":"required","parallel_tool_calls":false,"stream":true)")));
    REQUIRE(streamed.size() == 1);
    check_arguments(streamed[0].name, streamed[0].arguments);
  }
}

TEST_CASE("tool calls and structured outputs with the openai, AI SDK and LangChain clients, direct and through a router") {
  test::ReplicaProcess replica({"--tool-call-parser", "hermes", "--enable-auto-tool-choice"}, copy_default, "kvfleet-default");
  test::RouterProcess router({&replica});
  const std::string npm = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm";
  for (const std::string& base : {replica.base_url(), "http://127.0.0.1:" + std::to_string(router.port())}) {
    CAPTURE(base);
    const auto r = test::run_command("KVFLEET_NPM=" + npm + " node " + KVFLEET_SOURCE_DIR + "/tests/server/tool_clients.mjs " +
                                     base + " kvfleet-default 2>&1");
    CHECK_MESSAGE(r.status == 0, r.out);
    CHECK(r.out == "ok\n");
  }
}

// Qwen3's <think> and </think> (single tokens of its tokenizer).
TEST_CASE("with a reasoning parser, the constraint applies after the reasoning") {
  test::ReplicaProcess replica({"--reasoning-parser", "qwen3"}, test::make_tool_qwen, "tool-qwen");
  const auto ask = [&](const std::string& extra) {
    const auto r = replica.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"yes or no?"}],"temperature":0,)"
                                R"("structured_outputs":{"choice":["yes","no"]},)" + extra + "}");
    INFO(r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body).at("choices").at(0).as_object();
  };
  // Biased to open the reasoning and stay in it: free text (repeated <think>) until max_tokens.
  auto c = ask(R"("max_tokens":4,"logit_bias":{"151667":100})");
  CHECK(c.at("finish_reason") == "length");
  CHECK(c.at("message").at("reasoning_content") == "<think><think><think>");
  // Opened, closed at once, then the answer: one of the choices, as the grammar says.
  c = ask(R"("max_tokens":20,"logit_bias":{"151667":50,"151668":100})");
  CHECK(c.at("finish_reason") == "stop");
  CHECK(c.at("message").at("reasoning_content") == "");
  const std::string answer(c.at("message").at("content").as_string());
  CHECK((answer == "yes" || answer == "no"));
  // Without the reasoning's opening, the grammar applies from the first token.
  c = ask(R"("max_tokens":20,"logit_bias":{"151668":100})");
  CHECK(c.at("finish_reason") == "stop");
  CHECK((c.at("message").at("content") == "yes" || c.at("message").at("content") == "no"));
  CHECK(!c.at("message").as_object().contains("reasoning_content"));
}
