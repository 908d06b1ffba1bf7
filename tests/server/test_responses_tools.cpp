// Function tools on /v1/responses against real replica processes: function_call output items (whole and as
// OpenAI's typed stream events), the follow-up turn with function_call_output items, tool_choice auto (a
// tool-call parser), required and named (the grammar engine, on the committed default model).
#include <doctest/doctest.h>

#include "replica_fixture.h"
#include "tool_model.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

const char* tools_json = R"([{"type":"function","name":"get_weather","description":"Weather of a city",
  "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Rome"]}},"required":["city"]}},
  {"type":"function","name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string","enum":["CET","UTC"]}},
  "required":["zone"]}}])";

json::object ok(const http::Response& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  return json::parse(r.body).as_object();
}

struct Event {
  std::string type;
  json::object data;
};

std::vector<Event> events(const http::Response& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  std::vector<Event> out;
  for (std::size_t at = 0; (at = r.body.find("data: ", at)) != std::string::npos;) {
    const std::size_t end = r.body.find("\n\n", at);
    json::object data = json::parse(r.body.substr(at + 6, end - at - 6)).as_object();
    out.push_back({std::string(data.at("type").as_string()), std::move(data)});
    at = end;
  }
  return out;
}

void copy_default(const std::filesystem::path& out) {
  std::filesystem::copy(std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default", out,
                        std::filesystem::copy_options::recursive);
}

}  // namespace

TEST_CASE("responses: forced function calls on the default model, whole, streamed, and the follow-up turn") {
  test::ReplicaProcess replica({}, copy_default, "kvfleet-default");
  const std::string tools = std::string(R"("tools":)") + tools_json;
  const auto post = [&](const std::string& extra) {
    return replica.post("/v1/responses", R"({"input":"Weather in Paris?","max_output_tokens":60,)" + tools + "," + extra + "}");
  };

  SUBCASE("named: one function_call item; the follow-up sends its output back") {
    const auto r = ok(post(R"("tool_choice":{"type":"function","name":"get_weather"})"));
    CHECK(r.at("status") == "completed");
    CHECK(r.at("tool_choice").at("name") == "get_weather");
    const auto& output = r.at("output").as_array();
    REQUIRE(output.size() == 1);
    const auto& call = output[0].as_object();
    CHECK(call.at("type") == "function_call");
    CHECK(call.at("status") == "completed");
    CHECK(call.at("name") == "get_weather");
    CHECK(std::string(call.at("id").as_string()).starts_with("fc_"));
    CHECK(std::string(call.at("call_id").as_string()).starts_with("call_"));
    const json::value args = json::parse(call.at("arguments").as_string());
    CHECK((args.at("city") == "Paris" || args.at("city") == "Rome"));
    CHECK(args.as_object().size() == 1);

    // The next turn: the call's output as a function_call_output item, after the stored response (no tools:
    // this model's template has no tools section, which only a forced tool_choice or a parser makes up for).
    const json::object follow{{"previous_response_id", r.at("id")},
                              {"max_output_tokens", 3},
                              {"input", json::array{json::object{{"type", "function_call_output"},
                                                                 {"call_id", call.at("call_id")},
                                                                 {"output", "sunny, 24C"}}}}};
    const auto next = ok(replica.post("/v1/responses", json::serialize(follow)));
    CHECK(next.at("output").at(0).at("type") == "message");
    const auto plain = ok(replica.post("/v1/responses", R"({"input":"Weather in Paris?","max_output_tokens":1})"));
    CHECK(next.at("usage").at("input_tokens").as_int64() > plain.at("usage").at("input_tokens").as_int64() + 8);
    // Without the store: the call and its output as input items.
    json::object manual = follow;
    manual.erase("previous_response_id");
    manual["input"] = json::array{json::object{{"role", "user"}, {"content", "Weather in Paris?"}},
                                  json::object{{"type", "function_call"}, {"call_id", call.at("call_id")},
                                               {"name", "get_weather"}, {"arguments", call.at("arguments")}},
                                  follow.at("input").at(0)};
    CHECK(ok(replica.post("/v1/responses", json::serialize(manual))).at("status") != "failed");
  }

  SUBCASE("required, streamed: OpenAI's function call events, in order") {
    const auto ev = events(post(R"("tool_choice":"required","parallel_tool_calls":false,"stream":true)"));
    std::vector<std::string> types;
    for (const auto& e : ev) types.push_back(e.type);
    REQUIRE(types.size() >= 6);
    CHECK(types[0] == "response.created");
    CHECK(types[1] == "response.in_progress");
    CHECK(types[2] == "response.output_item.added");
    CHECK(ev[2].data.at("item").at("type") == "function_call");
    const std::string name(ev[2].data.at("item").at("name").as_string());
    CHECK((name == "get_weather" || name == "get_time"));
    std::string arguments;
    std::size_t i = 3;
    for (; i < ev.size() && ev[i].type == "response.function_call_arguments.delta"; ++i)
      arguments += ev[i].data.at("delta").as_string();
    REQUIRE(i + 3 == ev.size());
    CHECK(ev[i].type == "response.function_call_arguments.done");
    CHECK(ev[i].data.at("arguments") == json::value(arguments));
    CHECK(ev[i + 1].type == "response.output_item.done");
    CHECK(ev[i + 1].data.at("item").at("arguments") == json::value(arguments));
    CHECK(ev[i + 2].type == "response.completed");
    CHECK(ev[i + 2].data.at("response").at("output").at(0).at("type") == "function_call");
    const json::value args = json::parse(arguments);
    CHECK(args.as_object().size() == 1);
    for (std::size_t k = 0; k < ev.size(); ++k) CHECK(ev[k].data.at("sequence_number") == static_cast<std::int64_t>(k));
  }

  SUBCASE("auto without --enable-auto-tool-choice is a 400 naming tool_choice") {
    const auto r = replica.post("/v1/responses", R"({"input":"hi",)" + tools + "}");
    CHECK(r.status == 400);
    CHECK(json::parse(r.body).at("error").at("param") == "tool_choice");
  }
}

TEST_CASE("responses: tool_choice auto with a tool-call parser gives function_call items") {
  test::ReplicaProcess replica({"--tool-call-parser", "hermes", "--enable-auto-tool-choice"}, test::make_tool_qwen,
                               "tool-qwen");
  const std::string body = std::string(R"({"input":"Weather in Paris?","max_output_tokens":1,"temperature":0,"tools":)") +
                           tools_json + R"(,"logit_bias":{")" + std::to_string(test::call_token) + R"(":100})";
  const auto r = ok(replica.post("/v1/responses", body + "}"));
  const auto& call = r.at("output").at(0);
  CHECK(call.at("type") == "function_call");
  CHECK(call.at("name") == "get_weather");
  CHECK(json::parse(call.at("arguments").as_string()) == json::parse(R"({"city": "Paris"})"));
  const auto ev = events(replica.post("/v1/responses", body + R"(,"stream":true})"));
  std::string arguments, done;
  for (const auto& e : ev) {
    if (e.type == "response.function_call_arguments.delta") arguments += e.data.at("delta").as_string();
    if (e.type == "response.function_call_arguments.done") done = e.data.at("arguments").as_string();
  }
  CHECK(json::parse(arguments) == json::parse(R"({"city": "Paris"})"));
  CHECK(done == arguments);
}

TEST_CASE("responses: with a reasoning parser, a reasoning item first, whole and streamed; sent back in a later turn") {
  test::ReplicaProcess replica({"--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"},
                               test::make_tool_qwen, "tool-qwen");
  const std::string body = R"({"input":"Weather in Paris?","max_output_tokens":1,"temperature":0,"logit_bias":{")" +
                           std::to_string(test::think_token) + R"(":100})";
  const std::string thought = "\nThe user wants the weather.\n";  // think_text's reasoning, as chat gives it
  const auto r = ok(replica.post("/v1/responses", body + "}"));
  const auto& output = r.at("output").as_array();
  REQUIRE(output.size() == 2);
  const auto& item = output[0].as_object();
  CHECK(item.at("type") == "reasoning");
  CHECK(std::string(item.at("id").as_string()).starts_with("rs_"));
  CHECK(item.at("content").at(0).at("type") == "reasoning_text");
  CHECK(item.at("content").at(0).at("text") == json::value(thought));
  CHECK(item.at("summary").at(0).at("text") == json::value(thought));
  CHECK(output[1].at("type") == "message");
  CHECK(output[1].at("content").at(0).at("text") == "\n\nIt is sunny.");  // what follows </think>, as chat gives it

  const auto ev = events(replica.post("/v1/responses", body + R"(,"stream":true})"));
  std::string text, summary, done, answer;
  std::vector<std::string> added;
  for (std::size_t k = 0; k < ev.size(); ++k) {
    const auto& e = ev[k];
    CHECK(e.data.at("sequence_number") == static_cast<std::int64_t>(k));
    if (e.type == "response.output_item.added") added.push_back(std::string(e.data.at("item").at("type").as_string()));
    if (e.type == "response.reasoning_text.delta") text += e.data.at("delta").as_string();
    if (e.type == "response.reasoning_summary_text.delta") summary += e.data.at("delta").as_string();
    if (e.type == "response.reasoning_text.done") done = e.data.at("text").as_string();
    if (e.type == "response.output_text.delta") answer += e.data.at("delta").as_string();
  }
  CHECK(added == std::vector<std::string>{"reasoning", "message"});
  CHECK(text == thought);
  CHECK(summary == thought);
  CHECK(done == thought);
  CHECK(answer == "\n\nIt is sunny.");
  CHECK(ev.back().data.at("response").at("output").at(0).at("summary").at(0).at("text") == json::value(thought));

  // A later turn: the reasoning item (by reference to the stored one, or as an item) opens the assistant turn.
  // Qwen3's template renders the reasoning of an assistant turn after the last user message (here one with a
  // call and its output), so the prompt is longer with it than without it.
  const auto input_tokens = [&](const json::array& items) {
    const json::object next{{"input", items}, {"max_output_tokens", 1}};
    return ok(replica.post("/v1/responses", json::serialize(next))).at("usage").at("input_tokens").as_int64();
  };
  const json::object user{{"role", "user"}, {"content", "Weather in Paris?"}};
  const json::object call{{"type", "function_call"}, {"call_id", "call_1"}, {"name", "get_weather"},
                          {"arguments", R"({"city":"Paris"})"}};
  const json::object result{{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}};
  const std::int64_t without = input_tokens(json::array{user, call, result});
  const std::int64_t by_reference =
      input_tokens(json::array{user, json::object{{"type", "item_reference"}, {"id", item.at("id")}}, call, result});
  const std::int64_t as_item = input_tokens(json::array{user, item, call, result});
  CHECK(by_reference > without + 5);
  CHECK(as_item == by_reference);
  // Encrypted reasoning is not something this server makes or reads.
  json::object encrypted = item;
  encrypted["encrypted_content"] = "opaque";
  const auto refused = replica.post("/v1/responses", json::serialize(json::object{{"input", json::array{user, encrypted}}}));
  CHECK(refused.status == 400);
  CHECK(json::parse(refused.body).at("error").at("param") == "input[1].encrypted_content");
}
