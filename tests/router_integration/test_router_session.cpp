// Session affinity through a real router and real replicas: a conversation's turns stay on one replica
// even when its prompts share no leading block (a system prompt that carries the time), keyed by the
// session header or, when the router takes it, by the body's `user`.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "router_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;
namespace json = boost::json;

namespace {

// A prompt whose first block differs every turn (the clock leads the system prompt), about 80 tokens.
std::string turn_body(int turn, const std::string& user = "") {
  std::string system = "Time " + std::to_string(1000 + 37 * turn) + ". You answer briefly for the kvfleet project. ";
  for (int i = 0; i < 4; ++i) system += "Rule " + std::to_string(i) + ": cite the design, never guess. ";
  json::object body{{"model", "tiny-qwen"},
                    {"messages", json::array{json::object{{"role", "system"}, {"content", system}},
                                             json::object{{"role", "user"}, {"content", "Turn " + std::to_string(turn)}}}},
                    {"max_tokens", 2}};
  if (!user.empty()) body["user"] = user;
  return json::serialize(body);
}

std::string post_turn(const RouterProcess& router, int turn, const http::Headers& extra, const std::string& user = "") {
  http::Headers h{{"Content-Type", "application/json"}};
  for (const auto& f : extra.fields()) h.add(f.name, f.value);
  const http::Response r =
      http::http_request("127.0.0.1", router.port(), "POST", "/v1/chat/completions", turn_body(turn, user), h,
                         std::chrono::seconds(60));
  REQUIRE(r.status == 200);
  const std::string* replica = r.headers.find("x-kvfleet-replica");
  REQUIRE(replica);
  return *replica;
}

}  // namespace

TEST_CASE("session affinity: a session's turns stay on one replica; without a session they spread") {
  ReplicaProcess a, b, c;
  RouterProcess router({&a, &b, &c}, {"--session-from-user"});
  std::set<std::string> homes;
  int turn = 0;
  for (const std::string session : {"conv-a", "conv-b", "conv-c", "conv-d"}) {
    const std::string home = post_turn(router, turn++, {{"x-session-id", session}});
    for (int i = 0; i < 3; ++i) CHECK(post_turn(router, turn++, {{"x-session-id", session}}) == home);
    homes.insert(home);
  }
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"session\"") == 16);
  // The same sessions named by `user` land where the header put them (one key space).
  turn = 100;
  const std::string by_header = post_turn(router, turn++, {{"x-session-id", "conv-a"}});
  for (int i = 0; i < 3; ++i) CHECK(post_turn(router, turn++, {}, "conv-a") == by_header);
  // Without a session, the same kind of prompts go where their own first blocks hash to: not all to one.
  std::set<std::string> spread;
  for (int i = 200; i < 212; ++i) spread.insert(post_turn(router, i, {}));
  CHECK(spread.size() > 1);
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"new_prefix\"") >= 12);
}

TEST_CASE("session affinity: `user` is not a session unless the router is told so") {
  ReplicaProcess a, b, c;
  RouterProcess router({&a, &b, &c});
  std::set<std::string> seen;
  for (int i = 0; i < 12; ++i) seen.insert(post_turn(router, i, {}, "the-same-user"));
  CHECK(seen.size() > 1);
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"session\"") == 0);
}
