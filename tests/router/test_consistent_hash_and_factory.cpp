#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "router/policies/consistent_hash.h"
#include "router/policy.h"

using namespace kvfleet::router;

namespace {

std::vector<ReplicaState> named(std::initializer_list<const char*> ids) {
  std::vector<ReplicaState> out;
  for (const char* id : ids) out.push_back(ReplicaState{.id = id});
  return out;
}

// session key -> chosen replica id, for keys "user-0" ... "user-(n-1)"
std::map<std::string, std::string> assign(Policy& p, const std::vector<ReplicaState>& replicas, int n) {
  std::map<std::string, std::string> out;
  for (int i = 0; i < n; ++i) {
    const std::string key = "user-" + std::to_string(i);
    const Decision d = p.choose(RoutingRequest{.prompt_blocks = 1, .session_key = key}, replicas);
    REQUIRE(d.ok());
    CHECK(d.reason == "session_hash");
    out[key] = replicas[d.replica].id;
  }
  return out;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_CASE("consistent_hash: a session sticks to one replica, keys spread evenly") {
  ConsistentHashPolicy p;
  const auto four = named({"a:8000", "b:8000", "c:8000", "d:8000"});
  const auto before = assign(p, four, 4000);
  CHECK(assign(p, four, 4000) == before);
  std::map<std::string, int> per_replica;
  for (const auto& [key, id] : before) ++per_replica[id];
  REQUIRE(per_replica.size() == 4);
  for (const auto& [id, count] : per_replica) {
    CHECK(count > 700);  // 1000 each on average; 160 virtual nodes keep the spread near 10%
    CHECK(count < 1300);
  }
  CHECK(p.session_header() == "x-session-id");
}

TEST_CASE("consistent_hash: adding or removing a replica moves only the keys that must move") {
  ConsistentHashPolicy p;
  const auto four = named({"a:8000", "b:8000", "c:8000", "d:8000"});
  const auto before = assign(p, four, 4000);
  const auto after_add = assign(p, named({"a:8000", "b:8000", "c:8000", "d:8000", "e:8000"}), 4000);
  int moved = 0;
  for (const auto& [key, id] : after_add) {
    if (id == before.at(key)) continue;
    CHECK(id == "e:8000");  // a key only ever moves to the newcomer
    ++moved;
  }
  CHECK(moved > 500);  // about a fifth of 4000
  CHECK(moved < 1100);
  // Removing c (the list order changes too): only c's keys move.
  const auto after_remove = assign(p, named({"d:8000", "a:8000", "b:8000"}), 4000);
  for (const auto& [key, id] : after_remove) {
    if (before.at(key) != "c:8000") CHECK(id == before.at(key));
  }
}

TEST_CASE("consistent_hash: an unavailable owner hands its keys on and gets them back") {
  ConsistentHashPolicy p;
  auto replicas = named({"a", "b", "c"});
  const auto before = assign(p, replicas, 300);
  replicas[1].healthy = false;
  const auto during = assign(p, replicas, 300);
  for (const auto& [key, id] : during) {
    CHECK(id != "b");
    if (before.at(key) != "b") CHECK(id == before.at(key));
  }
  replicas[1].healthy = true;
  CHECK(assign(p, replicas, 300) == before);
  // No session key: least loaded.
  replicas[0].in_flight_requests = 2;
  replicas[1].in_flight_requests = 1;
  replicas[2].in_flight_requests = 3;
  const Decision d = p.choose(RoutingRequest{.prompt_blocks = 1}, replicas);
  CHECK(d.replica == 1);
  CHECK(d.reason == "no_session_key");
  for (auto& r : replicas) r.draining = true;
  CHECK(p.choose(RoutingRequest{.session_key = "user-1"}, replicas).reason == kNoReplica);
}

TEST_CASE("make_policy builds every policy by name and applies its knobs") {
  for (const char* name : {"cache_aware", "round_robin", "least_load", "power_of_two", "consistent_hash", "random"}) {
    CHECK(make_policy(name)->name() == name);
    CHECK(make_policy(YAML::Load(name))->name() == name);
  }
  auto strict = make_policy(YAML::Load("{name: cache_aware, cache_threshold: 0.9, load_weight: 0}"));
  std::vector<ReplicaState> replicas(2);
  replicas[0].matched_blocks = 8;
  replicas[0].in_flight_requests = 1;
  const RoutingRequest ten{.prompt_blocks = 10};
  CHECK(strict->choose(ten, replicas).reason == "no_match");
  CHECK(make_policy("cache_aware")->choose(ten, replicas).reason == "cache_hit");
  auto sticky = make_policy(YAML::Load("{name: consistent_hash, header: x-user, virtual_nodes: 8}"));
  CHECK(sticky->session_header() == "x-user");
  auto seeded = make_policy(YAML::Load("{name: random, seed: 3}"));
  auto seeded_again = make_policy(YAML::Load("{name: random, seed: 3}"));
  for (int i = 0; i < 10; ++i) CHECK(seeded->choose(ten, replicas).replica == seeded_again->choose(ten, replicas).replica);
}

TEST_CASE("make_policy rejects unknown names, unknown knobs and bad values, naming them") {
  CHECK(message_of([] { make_policy("fastest"); }) ==
        "unknown routing policy 'fastest' (known: cache_aware, round_robin, least_load, power_of_two, "
        "consistent_hash, random)");
  CHECK(message_of([] { make_policy(YAML::Load("{name: cache_aware, cache_treshold: 0.5}")); }) ==
        "policy 'cache_aware': unknown knob 'cache_treshold' (known: balance_abs_threshold, "
        "balance_rel_threshold, cache_threshold, disk_tier_weight, host_tier_weight, kv_usage_limit, "
        "kv_usage_weight, load_weight, new_prefix_slack, rendezvous_blocks, shared_tier_weight)");
  CHECK(message_of([] { make_policy(YAML::Load("{name: round_robin, seed: 1}")); }) ==
        "policy 'round_robin': unknown knob 'seed' (known: none)");
  CHECK(message_of([] { make_policy(YAML::Load("{name: cache_aware, cache_threshold: 1.5}")); }) ==
        "policy 'cache_aware': knob 'cache_threshold' must be in [0, 1], got 1.5");
  CHECK(message_of([] { make_policy(YAML::Load("{name: cache_aware, load_weight: lots}")); }) ==
        "policy 'cache_aware': knob 'load_weight' must be a number");
  CHECK(message_of([] { make_policy(YAML::Load("{name: power_of_two, seed: -4}")); }) ==
        "policy 'power_of_two': knob 'seed' must be a non-negative integer");
  CHECK(message_of([] { make_policy(YAML::Load("{name: consistent_hash, virtual_nodes: 0}")); }) ==
        "policy 'consistent_hash': knob 'virtual_nodes' must be in [1, 10000], got 0");
  CHECK(message_of([] { make_policy(YAML::Load("{cache_threshold: 0.5}")); }) ==
        "routing policy: expected a name or a map with a 'name' key");
}
