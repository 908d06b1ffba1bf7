// POST /v1/responses, GET and DELETE /v1/responses/{id} on a real replica process: the openai npm
// client and the AI SDK 5 as users run them, and raw HTTP for bad input and the store's bounds.
#include <doctest/doctest.h>

#include <csignal>
#include <thread>

#include "replica_fixture.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

test::CommandResult node(const char* script, const test::ReplicaProcess& replica) {
  const std::string npm = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm";
  return test::run_command("KVFLEET_NPM=" + npm + " node " + KVFLEET_SOURCE_DIR + "/tests/server/" + script + " " +
                           replica.base_url() + " tiny-qwen 2>&1");
}

}  // namespace

TEST_CASE("the openai npm client: responses plain, streamed, stored follow-up, retrieve, delete, errors") {
  test::ReplicaProcess replica;
  const auto r = node("responses_client.mjs", replica);
  CHECK_MESSAGE(r.status == 0, r.out);
  CHECK(r.out == "ok\n");
}

TEST_CASE("the AI SDK 5: createOpenAI({baseURL})(model) with generateText, streamText and follow-ups") {
  test::ReplicaProcess replica;
  const auto r = node("ai_sdk_client.mjs", replica);
  CHECK_MESSAGE(r.status == 0, r.out);
  CHECK(r.out == "ok\n");
}

TEST_CASE("responses: bad input is a 400 naming the field; unknown ids are 404; the replica keeps serving") {
  test::ReplicaProcess replica({"--max-model-len", "64"});
  struct Case {
    std::string body;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {R"({"model":"tiny-qwen"})", 400, "input"},
      {R"({"input":"hi","max_output_tokens":500})", 400, "max_output_tokens"},
      {R"({"input":")" + std::string(300, 'a') + " " + std::string(300, 'b') + R"("})", 400, "input"},
      {R"({"input":"hi","tools":[{"type":"function","name":"get"}]})", 400, "tool_choice"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]})", 400, "input[0].content[0].type"},
      {R"({"input":"hi","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"number","multipleOf":3}}}})", 400, "text.format"},
      {R"({"input":"hi","reasoning":{"effort":"low"}})", 400, "reasoning.effort"},
      {R"({"input":"hi","background":true})", 400, "background"},
      {R"({"input":"hi","include":["file_search_call.results"]})", 400, "include"},
      {R"({"input":[{"type":"item_reference","id":"msg_nope"}]})", 400, "input[0].id"},
      {R"({"input":"hi","previous_response_id":"resp_nope"})", 400, "previous_response_id"},
      {R"({"input":"hi","model":"other"})", 404, "model"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.body.substr(0, 80));
    const auto res = replica.post("/v1/responses", c.body);
    CHECK(res.status == c.status);
    const auto err = json::parse(res.body).at("error");
    CHECK(err.at("message").as_string().size() > 0);
    CHECK(err.at("param") == c.param);
  }
  CHECK(replica.get("/v1/responses/resp_nope").status == 404);
  CHECK(http::http_request("127.0.0.1", replica.port(), "DELETE", "/v1/responses/resp_nope", {}, {},
                           std::chrono::seconds(10)).status == 404);
  CHECK(replica.get("/v1/responses").status == 405);
  CHECK(replica.get("/v1/responses/resp_1/input_items").status == 404);
  // truncation "auto" drops the oldest turns until the prompt fits; "disabled" refuses it.
  const std::string long_turns = R"([{"role":"user","content":")" + std::string(300, 'a') + " " + std::string(300, 'b') + R"("},)"
                                 R"({"role":"assistant","content":"ok"},{"role":"user","content":"hi"}])";
  CHECK(replica.post("/v1/responses", R"({"input":)" + long_turns + R"(,"max_output_tokens":4})").status == 400);
  const auto cut = replica.post("/v1/responses", R"({"input":)" + long_turns + R"(,"max_output_tokens":4,"truncation":"auto"})");
  REQUIRE(cut.status == 200);
  CHECK(json::parse(cut.body).at("usage").at("input_tokens").as_int64() + 4 <= 64);
  const auto ok = replica.post("/v1/responses", R"({"input":"hi","max_output_tokens":2})");
  CHECK(ok.status == 200);
  CHECK(ok.headers.find("x-kvfleet-response-id") != nullptr);
  // Requests by id count under one metric label, not one per id.
  const std::string metrics = replica.get("/metrics").body;
  CHECK(metrics.find(R"(path="/v1/responses/{id}",status="404")") != std::string::npos);
  CHECK(metrics.find("resp_nope") == std::string::npos);
}

TEST_CASE("the store keeps its newest responses within --responses-store-entries") {
  test::ReplicaProcess replica({"--responses-store-entries", "2"});
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    const auto r = replica.post("/v1/responses", R"({"input":"hi","max_output_tokens":1})");
    REQUIRE(r.status == 200);
    ids.emplace_back(json::parse(r.body).at("id").as_string());
  }
  CHECK(replica.get("/v1/responses/" + ids[0]).status == 404);
  CHECK(replica.get("/v1/responses/" + ids[1]).status == 200);
  const auto got = replica.get("/v1/responses/" + ids[2]);
  CHECK(got.status == 200);
  CHECK(json::parse(got.body).at("id").as_string() == ids[2]);
}

TEST_CASE("a stream that fails mid-way (a drain that runs out of time) ends with error and response.failed") {
  test::ReplicaProcess replica({"--drain-timeout-ms", "200"});
  http::Response streamed;
  std::thread running([&] {
    streamed = replica.post("/v1/responses", R"({"input":"Count:","max_output_tokens":4000,"ignore_eos":true,"stream":true})");
  });
  for (int i = 0; i < 200 && replica.metric("kvfleet_requests_running") < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  replica.process().signal(SIGTERM);
  running.join();
  CHECK(streamed.status == 200);
  const std::string& body = streamed.body;
  CHECK(body.rfind("event: response.created\n", 0) == 0);
  const std::size_t error = body.find("event: error\n");
  const std::size_t failed = body.find("event: response.failed\n");
  REQUIRE(error != std::string::npos);
  REQUIRE(failed != std::string::npos);
  CHECK(error < failed);
  CHECK(body.find("shutting down") != std::string::npos);  // the engine's own reason reaches the client
  CHECK(body.find("response.completed") == std::string::npos);
  CHECK(body.find("[DONE]") == std::string::npos);
  const auto last = json::parse(body.substr(body.find("data: ", failed) + 6));
  CHECK(last.at("response").at("status") == "failed");
  CHECK(last.at("response").at("error").at("message").as_string().size() > 0);
  CHECK(replica.process().wait(std::chrono::seconds(20)) == 0);
}

TEST_CASE("function tools with tool_choice none reach the chat template (and no call is parsed)") {
  test::ReplicaProcess replica;
  const auto input_tokens = [&](const std::string& extra) {
    const auto r = replica.post("/v1/responses", R"({"input":"Weather?","max_output_tokens":2,"store":false)" + extra + "}");
    REQUIRE(r.status == 200);
    const auto body = json::parse(r.body);
    CHECK(body.at("output").at(0).at("type") == "message");
    return body.at("usage").at("input_tokens").as_int64();
  };
  const std::string tools = R"(,"tool_choice":"none","tools":[{"type":"function","name":"get_weather",)"
                            R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}])";
  CHECK(input_tokens(tools) > input_tokens("") + 50);
}
