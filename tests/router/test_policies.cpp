#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "router/policies/cache_aware.h"
#include "router/policies/least_load.h"
#include "router/policies/power_of_two.h"
#include "router/policies/random.h"
#include "router/policies/round_robin.h"
#include "router/policy.h"

using namespace kvfleet::router;

namespace {

// {requests in flight, matched blocks}; ids r0, r1, ...
std::vector<ReplicaState> fleet(std::initializer_list<std::pair<std::uint32_t, std::uint32_t>> loads_and_matches) {
  std::vector<ReplicaState> out;
  for (const auto& [load, matched] : loads_and_matches) {
    ReplicaState r;
    r.id = "r";  // (not "r" + to_string: GCC 12 raises a false -Wrestrict on that)
    r.id += std::to_string(out.size());
    r.in_flight_requests = load;
    r.in_flight_tokens = 100ull * load;
    r.matched_blocks = matched;
    out.push_back(r);
  }
  return out;
}

RoutingRequest prompt(std::uint32_t blocks) { return RoutingRequest{.prompt_blocks = blocks, .prompt_tokens = blocks * 16ull}; }

void check_decision(Decision d, std::size_t replica, std::string_view reason) {
  CHECK(d.ok());
  CHECK(d.replica == replica);
  CHECK(d.reason == reason);
}

}  // namespace

TEST_CASE("cache_aware: the best match wins when the fleet is balanced") {
  CacheAwarePolicy p;
  check_decision(p.choose(prompt(10), fleet({{2, 8}, {1, 2}, {0, 0}})), 0, "cache_hit");
  // A match longer than the prompt (a shorter prompt of a longer cached chain) counts as full.
  check_decision(p.choose(prompt(4), fleet({{0, 3}, {0, 4}})), 1, "cache_hit");
}

TEST_CASE("cache_aware: load_weight trades match length against load") {
  const auto replicas = fleet({{4, 8}, {0, 7}});
  // load_weight 0.5: r0 scores 0.8 - 0.5 * 4/4 = 0.3, r1 scores 0.7 - 0 = 0.7.
  CacheAwarePolicy weighted(CacheAwareConfig{.load_weight = 0.5});
  check_decision(weighted.choose(prompt(10), replicas), 1, "cache_hit");
  CacheAwarePolicy longest(CacheAwareConfig{.load_weight = 0.0});
  check_decision(longest.choose(prompt(10), replicas), 0, "cache_hit");
  // Equal scores: the less loaded replica, then the lower index.
  check_decision(longest.choose(prompt(10), fleet({{3, 6}, {2, 6}, {2, 6}})), 1, "cache_hit");
}

TEST_CASE("cache_aware: a match below cache_threshold goes to the least loaded replica") {
  CacheAwarePolicy p;
  check_decision(p.choose(prompt(10), fleet({{2, 4}, {1, 0}, {1, 0}})), 1, "no_match");
  check_decision(p.choose(prompt(10), fleet({{2, 5}, {1, 0}})), 0, "cache_hit");  // 0.5 is enough
  // A prompt shorter than one block has nothing to match.
  check_decision(p.choose(prompt(0), fleet({{2, 0}, {1, 0}})), 1, "no_match");
  CacheAwarePolicy strict(CacheAwareConfig{.cache_threshold = 0.9});
  check_decision(strict.choose(prompt(10), fleet({{2, 8}, {1, 0}})), 1, "no_match");
}

TEST_CASE("cache_aware: imbalance needs both the absolute gap and the ratio") {
  CacheAwarePolicy p;  // abs 32, rel 1.5
  // 40 - 3 > 32 and 40 > 1.5 * 3: imbalanced, the full match on r0 is ignored.
  check_decision(p.choose(prompt(10), fleet({{40, 10}, {5, 0}, {3, 0}})), 2, "imbalance");
  // Gap 30 <= 32: balanced enough.
  check_decision(p.choose(prompt(10), fleet({{33, 10}, {3, 0}})), 0, "cache_hit");
  // Gap 35 > 32 but 105 <= 1.5 * 70: balanced enough.
  check_decision(p.choose(prompt(10), fleet({{105, 10}, {70, 0}})), 0, "cache_hit");
  // An unavailable replica's load does not count towards imbalance.
  auto replicas = fleet({{40, 10}, {3, 0}, {39, 0}});
  replicas[1].healthy = false;
  check_decision(p.choose(prompt(10), replicas), 0, "cache_hit");
}

TEST_CASE("cache_aware: unhealthy and draining replicas are never chosen") {
  CacheAwarePolicy p;
  auto replicas = fleet({{0, 10}, {0, 9}, {5, 8}});
  replicas[0].healthy = false;
  replicas[1].draining = true;
  check_decision(p.choose(prompt(10), replicas), 2, "cache_hit");
  replicas[2].healthy = false;
  const Decision d = p.choose(prompt(10), replicas);
  CHECK_FALSE(d.ok());
  CHECK(d.reason == kNoReplica);
  CHECK_FALSE(p.choose(prompt(10), {}).ok());
}

TEST_CASE("least_load: fewest requests, then fewest tokens, then lowest index") {
  LeastLoadPolicy p;
  auto replicas = fleet({{3, 0}, {1, 9}, {1, 0}, {2, 0}});
  replicas[1].in_flight_tokens = 500;
  replicas[2].in_flight_tokens = 400;
  check_decision(p.choose(prompt(10), replicas), 2, "least_load");
  replicas[1].in_flight_tokens = 400;
  check_decision(p.choose(prompt(10), replicas), 1, "least_load");
  replicas[1].draining = true;
  check_decision(p.choose(prompt(10), replicas), 2, "least_load");
  for (auto& r : replicas) r.healthy = false;
  CHECK(p.choose(prompt(10), replicas).reason == kNoReplica);
}

TEST_CASE("round_robin: turns in list order, skipping unavailable replicas") {
  RoundRobinPolicy p;
  auto replicas = fleet({{0, 0}, {9, 9}, {0, 0}});
  std::vector<std::size_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(p.choose(prompt(1), replicas).replica);
  CHECK(got == std::vector<std::size_t>{0, 1, 2, 0});
  replicas[1].draining = true;
  got.clear();
  for (int i = 0; i < 4; ++i) got.push_back(p.choose(prompt(1), replicas).replica);
  CHECK(got == std::vector<std::size_t>{2, 0, 2, 0});
  CHECK(p.choose(prompt(1), replicas).reason == "round_robin");
  for (auto& r : replicas) r.draining = true;
  CHECK(p.choose(prompt(1), replicas).reason == kNoReplica);
}

TEST_CASE("power_of_two: the less loaded of two random replicas; the most loaded never wins") {
  const auto replicas = fleet({{0, 0}, {5, 0}, {9, 0}});
  PowerOfTwoPolicy p(7), same(7);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 600; ++i) {
    const Decision d = p.choose(prompt(1), replicas);
    CHECK(d.reason == "power_of_two");
    CHECK(same.choose(prompt(1), replicas).replica == d.replica);  // the seed fixes the sequence
    ++counts[d.replica];
  }
  CHECK(counts[2] == 0);
  // Pairs {0,1} and {0,2} pick r0, {1,2} picks r1: r0 wins 2/3 of the draws.
  CHECK(counts[0] > 340);
  CHECK(counts[0] < 460);
  // Two available replicas: every pair is both, so the less loaded one always wins.
  auto two = replicas;
  two[0].healthy = false;
  for (int i = 0; i < 20; ++i) check_decision(p.choose(prompt(1), two), 1, "power_of_two");
  two[1].draining = true;
  check_decision(p.choose(prompt(1), two), 2, "power_of_two");
  two[2].draining = true;
  CHECK_FALSE(p.choose(prompt(1), two).ok());
}

TEST_CASE("random: uniform over available replicas, repeatable with a seed") {
  auto replicas = fleet({{0, 0}, {0, 0}, {0, 0}, {0, 0}});
  replicas[2].healthy = false;
  RandomPolicy p(42), same(42);
  int counts[4] = {0, 0, 0, 0};
  for (int i = 0; i < 900; ++i) {
    const Decision d = p.choose(prompt(1), replicas);
    CHECK(same.choose(prompt(1), replicas).replica == d.replica);
    CHECK(d.reason == "random");
    ++counts[d.replica];
  }
  CHECK(counts[2] == 0);
  for (const int i : {0, 1, 3}) {
    CHECK(counts[i] > 240);
    CHECK(counts[i] < 360);
  }
}

TEST_CASE("cache_aware: a session's uncached prompts all go to the replica its key hashes to") {
  CacheAwarePolicy p;
  const auto replicas = fleet({{1, 0}, {1, 0}, {1, 0}, {1, 0}});
  // Different prompts (different block hashes) of one session: one replica, reason "session".
  std::vector<std::size_t> chosen;
  for (kvfleet::BlockHash h = 1; h <= 6; ++h) {
    const std::vector<kvfleet::BlockHash> hashes{h * 7919, h * 104729};
    RoutingRequest r = prompt(2);
    r.block_hashes = hashes;
    r.session_key = "conversation-42";
    const Decision d = p.choose(r, replicas);
    check_decision(d, d.replica, "session");
    chosen.push_back(d.replica);
  }
  CHECK(std::count(chosen.begin(), chosen.end(), chosen[0]) == 6);
  // Without the key the same prompts spread by their own hashes.
  std::vector<std::size_t> spread;
  for (kvfleet::BlockHash h = 1; h <= 6; ++h) {
    const std::vector<kvfleet::BlockHash> hashes{h * 7919, h * 104729};
    RoutingRequest r = prompt(2);
    r.block_hashes = hashes;
    const Decision d = p.choose(r, replicas);
    CHECK(d.reason == "new_prefix");
    spread.push_back(d.replica);
  }
  CHECK(std::count(spread.begin(), spread.end(), spread[0]) < 6);
  // Many sessions use every replica; a prompt shorter than a block still follows its session.
  std::vector<int> per_replica(replicas.size());
  for (int s = 0; s < 64; ++s) {
    const std::string key = "session-" + std::to_string(s);
    RoutingRequest r = prompt(0);
    r.session_key = key;
    const Decision d = p.choose(r, replicas);
    REQUIRE(d.ok());
    CHECK(d.reason == "session");
    per_replica[d.replica] += 1;
  }
  for (int n : per_replica) CHECK(n > 0);
}

TEST_CASE("cache_aware: a cache hit and the load check win over the session") {
  CacheAwarePolicy p;
  RoutingRequest r = prompt(10);
  r.session_key = "conversation-7";
  auto replicas = fleet({{1, 0}, {1, 0}, {1, 0}});
  const std::size_t home = p.choose(r, replicas).replica;
  const std::size_t other = (home + 1) % replicas.size();
  replicas[other].matched_blocks = 8;
  check_decision(p.choose(r, replicas), other, "cache_hit");
  replicas[other].matched_blocks = 0;
  // The session's replica far busier than the rest (beyond new_prefix_slack): it yields.
  replicas[home].in_flight_requests = 6;
  const Decision d = p.choose(r, replicas);
  CHECK(d.replica != home);
  // Back to a balanced fleet: home again.
  replicas[home].in_flight_requests = 1;
  check_decision(p.choose(r, replicas), home, "session");
  // Unavailable: another replica, and home again once it recovers.
  replicas[home].healthy = false;
  CHECK(p.choose(r, replicas).replica != home);
  replicas[home].healthy = true;
  check_decision(p.choose(r, replicas), home, "session");
}
