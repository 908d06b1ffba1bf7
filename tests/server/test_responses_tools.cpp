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
