// Mid-stream failover of sampled streams: the router gives an unseeded sampled stream a seed of its own,
// so that a resumed stream continues the same random draws (a seeded stream's resumption is exact:
// test_router_failover.cpp). Against a scripted stand-in that records what it was sent.
#include <doctest/doctest.h>

#include "hardening_support.h"

namespace kvfleet::test {
namespace json = boost::json;
using namespace hardening;

namespace {

json::object forwarded_body(const std::string& body, bool failover) {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.stream_events = 2;
  RouterProcess router({}, standin_flags({&up}, {"--failover", failover ? "true" : "false"}));
  REQUIRE(router.post("/v1/completions", body).status == 200);
  const auto bodies = up.completion_bodies();
  REQUIRE(bodies.size() == 1);
  return json::parse(bodies[0]).as_object();
}

}  // namespace

TEST_CASE("failover: an unseeded sampled stream is sent with a router-drawn seed; others as they came") {
  const std::string base = R"({"model":"tiny-qwen","prompt":"Hello there","max_tokens":2,"stream":true)";
  SUBCASE("sampled without a seed (temperature given or the default): seeded") {
    for (const char* extra : {"", R"(,"temperature":0.8)", R"(,"seed":null)"}) {
      const json::object sent = forwarded_body(base + extra + "}", true);
      REQUIRE(sent.contains("seed"));
      CHECK(sent.at("seed").is_int64());
      CHECK(sent.at("seed").as_int64() >= 0);
      CHECK(sent.at("prompt") == "Hello there");
    }
  }
  SUBCASE("greedy, seeded by the client, not streamed, or failover off: the body untouched") {
    CHECK_FALSE(forwarded_body(base + R"(,"temperature":0})", true).contains("seed"));
    CHECK(forwarded_body(base + R"(,"temperature":0.8,"seed":42})", true).at("seed") == 42);
    CHECK_FALSE(forwarded_body(R"({"model":"tiny-qwen","prompt":"Hello there","max_tokens":2})", true).contains("seed"));
    CHECK_FALSE(forwarded_body(base + "}", false).contains("seed"));
  }
}

}  // namespace kvfleet::test
