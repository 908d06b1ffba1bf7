// The Responses API through kvfleet-router: the openai npm client and the AI SDK 5 against the router,
// follow-ups (previous_response_id, item_reference) and GET/DELETE by id reaching the replica that stored
// the response (also through a router that never saw it), and prefix routing of the rendered prompt.
#include <doctest/doctest.h>

#include "router_fixture.h"

namespace kvfleet::test {
namespace json = boost::json;

namespace {

CommandResult node(const char* script, std::uint16_t router_port) {
  const std::string npm = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm";
  return run_command("KVFLEET_NPM=" + npm + " node " + KVFLEET_SOURCE_DIR + "/tests/server/" + script +
                     " http://127.0.0.1:" + std::to_string(router_port) + " tiny-qwen 2>&1");
}

std::string served_by(const http::Response& r) {
  const std::string* v = r.headers.find("x-kvfleet-replica");
  return v ? *v : "";
}

}  // namespace

TEST_CASE("responses through the router: both clients; follow-ups and GET/DELETE by id reach the replica that stored it") {
  ReplicaProcess a, b;
  // Round robin: a follow-up that followed the policy would land on the other replica half of the time.
  RouterProcess router({&a, &b}, {"--policy", "round_robin"});
  const auto openai = node("responses_client.mjs", router.port());
  CHECK_MESSAGE(openai.status == 0, openai.out);
  const auto ai_sdk = node("ai_sdk_client.mjs", router.port());
  CHECK_MESSAGE(ai_sdk.status == 0, ai_sdk.out);

  // Stored through this router; read, continued and deleted through another one that never saw it.
  const auto first = router.post("/v1/responses", R"({"input":"Hello!","max_output_tokens":2})");
  REQUIRE(first.status == 200);
  const std::string id(json::parse(first.body).at("id").as_string());
  RouterProcess other({&a, &b}, {"--policy", "round_robin"});
  for (int i = 0; i < 4; ++i) {
    const auto follow = other.post("/v1/responses", R"({"input":"More.","max_output_tokens":2,"previous_response_id":")" + id + "\"}");
    CHECK(follow.status == 200);
    CHECK(served_by(follow) == served_by(first));
  }
  const auto got = other.get("/v1/responses/" + id);
  CHECK(got.status == 200);
  CHECK(json::parse(got.body).at("id").as_string() == id);
  const auto deleted = http::http_request("127.0.0.1", other.port(), "DELETE", "/v1/responses/" + id, {}, {},
                                          std::chrono::seconds(10));
  CHECK(deleted.status == 200);
  CHECK(json::parse(deleted.body).at("deleted") == true);
  CHECK(router.get("/v1/responses/" + id).status == 404);
  const auto gone = router.post("/v1/responses", R"({"input":"x","previous_response_id":")" + id + "\"}");
  CHECK(gone.status == 400);
  CHECK(json::parse(gone.body).at("error").at("param") == "previous_response_id");
}

TEST_CASE("responses route by prefix: the router renders instructions and input as the replica does") {
  ReplicaProcess a({"--num-kv-blocks", "96"}), b({"--num-kv-blocks", "96"});
  RouterProcess router({&a, &b});
  std::string instructions = "You are a meticulous assistant for the kvfleet project. ";
  for (int i = 0; i < 12; ++i) instructions += "Rule " + std::to_string(i) + ": answer briefly, never guess. ";
  const auto body = [&](int i) {
    return json::serialize(json::object{{"instructions", instructions}, {"max_output_tokens", 2},
                                        {"input", json::array{json::object{{"role", "user"}, {"content", json::array{
                                            json::object{{"type", "input_text"}, {"text", "Question " + std::to_string(i)}}}}}}}});
  };
  const auto first = router.post("/v1/responses", body(0));
  REQUIRE(first.status == 200);
  const std::string home = served_by(first);
  REQUIRE(wait_until([&] { return router.replica(home).at("events_applied").as_int64() > 0; }, std::chrono::seconds(10)));
  for (int i = 1; i <= 3; ++i) {
    const auto r = router.post("/v1/responses", body(i));
    REQUIRE(r.status == 200);
    CHECK(served_by(r) == home);
    CHECK(json::parse(r.body).at("usage").at("input_tokens_details").at("cached_tokens").as_int64() >= 4 * 16);
  }
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"cache_hit\"") == 3);
}

}  // namespace kvfleet::test
