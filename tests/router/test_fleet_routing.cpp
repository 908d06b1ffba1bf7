// The router at fleet scale: exact mode's pending marks, the rendezvous placement of new
// prefixes that several routers compute alike, the replica-reported load, and discovery's pieces.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "router/gateway/discovery.h"
#include "router/gateway/router_config.h"
#include "router/policies/cache_aware.h"
#include "router/replica_cache_index.h"
#include "support/temp_dir.h"

using namespace kvfleet;
using namespace kvfleet::router;

namespace {

using Chain = std::vector<BlockHash>;
constexpr BlockHash kRootHash = 0xABCDEF;

struct Index {
  ReplicaCacheIndex index{ReplicaCacheConfig{.block_size = 16, .root = kRootHash, .pending_ttl = 1000}};
  Index() {
    for (ReplicaId r = 0; r < 3; ++r) {
      index.add_replica(r);
      index.begin_stream(r);
      REQUIRE(feed(r, R"({"type":"config","seq":0,"block_size":16,"root":11259375})").status ==
              EventStatus::config_accepted);
    }
  }
  EventOutcome feed(ReplicaId r, const std::string& json, Tick now = 1) { return index.apply_event(r, json, now); }
  std::uint32_t matched(ReplicaId r, const Chain& c) const { return index.match(c).of(r); }
};

std::vector<ReplicaState> fleet(std::size_t n, std::vector<std::uint32_t> loads = {}) {
  std::vector<ReplicaState> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i].id = "http://10.0.0.";
    out[i].id += std::to_string(i + 1);
    out[i].id += ":8000";
    out[i].in_flight_requests = i < loads.size() ? loads[i] : 0;
  }
  return out;
}

RoutingRequest request_for(const Chain& hashes) {
  return RoutingRequest{.prompt_blocks = static_cast<std::uint32_t>(hashes.size()),
                        .prompt_tokens = hashes.size() * 16,
                        .block_hashes = hashes};
}

}  // namespace

TEST_CASE("exact mode: a routed prefix is pending on its replica until its stored event confirms it") {
  Index f;
  f.index.on_routed(1, Chain{1, 2, 3}, 100);
  CHECK(f.matched(1, Chain{1, 2, 3, 4}) == 3);  // the next request with this prefix sees it on replica 1
  CHECK(f.matched(0, Chain{1, 2, 3}) == 0);
  CHECK(f.index.pending_blocks() == 3);
  // The replica's event confirms two of them; the third never comes.
  CHECK(f.feed(1, R"({"seq":1,"type":"stored","block_hashes":[1,2],"parent":11259375})").status == EventStatus::applied);
  CHECK(f.index.pending_confirmed() == 2);
  f.index.sweep(1099);
  CHECK(f.matched(1, Chain{1, 2, 3}) == 3);
  f.index.sweep(1100);  // pending_ttl after the route: the unconfirmed block goes, the confirmed stay
  CHECK(f.matched(1, Chain{1, 2, 3}) == 2);
  CHECK(f.index.pending_expired() == 1);
  CHECK(f.index.pending_blocks() == 0);
  f.index.tree().check_integrity();
}

TEST_CASE("exact mode: a later route refreshes a pending mark; cleared, reconnects and removal drop them") {
  Index f;
  f.index.on_routed(0, Chain{5, 6}, 100);
  f.index.on_routed(0, Chain{5, 6, 7}, 900);  // the same prefix again before any event
  f.index.sweep(1500);                         // the first route's expiry: refreshed by the second
  CHECK(f.matched(0, Chain{5, 6, 7}) == 3);
  f.index.sweep(1900);
  CHECK(f.matched(0, Chain{5, 6, 7}) == 0);
  f.index.on_routed(0, Chain{8}, 2000);
  CHECK(f.feed(0, R"({"seq":7,"type":"cleared"})").status == EventStatus::applied);
  CHECK(f.matched(0, Chain{8}) == 0);
  CHECK(f.index.pending_blocks() == 0);
  f.index.on_routed(2, Chain{9, 10}, 2000);
  f.index.begin_stream(2);  // a reconnect: the replay brings what is real
  CHECK(f.matched(2, Chain{9, 10}) == 0);
  CHECK(f.index.pending_blocks() == 0);
  f.index.on_routed(1, Chain{9}, 2000);
  f.index.remove_replica(1);
  CHECK(f.index.pending_blocks() == 0);
  f.index.tree().check_integrity();
}

TEST_CASE("cache_aware: a group's requests that arrive before any event stay on one replica") {
  Index f;
  CacheAwarePolicy policy;
  std::set<std::size_t> used;
  for (int i = 0; i < 8; ++i) {
    const Chain prompt{100, 101, 102, 103, BlockHash(200 + i)};  // shared prefix, a different question
    std::vector<ReplicaState> states = fleet(3);
    const MatchResult m = f.index.match(prompt);
    for (ReplicaId r = 0; r < 3; ++r) {
      states[r].matched_blocks = m.of(r);
      states[r].in_flight_requests = 0;
    }
    const Decision d = policy.choose(request_for(prompt), states);
    REQUIRE(d.ok());
    CHECK(d.reason == (i == 0 ? "new_prefix" : "cache_hit"));
    used.insert(d.replica);
    f.index.on_routed(static_cast<ReplicaId>(d.replica), prompt, 10 + i);
  }
  CHECK(used.size() == 1);
}

TEST_CASE("cache_aware: routers with different own loads place a new prefix alike (rendezvous)") {
  CacheAwarePolicy a, b;
  std::map<std::size_t, int> spread;
  for (BlockHash key = 1; key <= 300; ++key) {
    const Chain prompt{key * 7919, key * 104729};
    // Each router counts only its own requests: their views differ, within the slack.
    const Decision da = a.choose(request_for(prompt), fleet(4, {0, 2, 1, 0}));
    const Decision db = b.choose(request_for(prompt), fleet(4, {1, 0, 2, 2}));
    REQUIRE(da.ok());
    CHECK(da.replica == db.replica);
    CHECK(da.reason == "new_prefix");
    spread[da.replica] += 1;
  }
  CHECK(spread.size() == 4);  // and prefixes spread over every replica
  for (const auto& [replica, n] : spread) CHECK(n > 40);
}

TEST_CASE("cache_aware: the rendezvous skips replicas whose load or KV usage does not allow") {
  CacheAwarePolicy p(CacheAwareConfig{.new_prefix_slack = 1});
  const Chain prompt{42, 43};
  const std::size_t first = p.choose(request_for(prompt), fleet(3)).replica;
  std::vector<std::uint32_t> loads(3, 0);
  loads[first] = 2;  // two above the least loaded: over the slack
  const Decision d = p.choose(request_for(prompt), fleet(3, loads));
  CHECK(d.reason == "new_prefix");
  CHECK(d.replica != first);
  // The replica's own report counts (another router's requests are on it), and so does its KV usage.
  std::vector<ReplicaState> reported = fleet(3);
  reported[first].load_reported = true;
  reported[first].reported_waiting = 3;
  CHECK(reported[first].load() == 3);
  CHECK(p.choose(request_for(prompt), reported).replica != first);
  reported[first].reported_waiting = 0;
  reported[first].kv_usage = 0.99;
  CHECK(p.choose(request_for(prompt), reported).replica != first);
  // The key is one block hash: prompts that share their first rendezvous_blocks blocks go together.
  CacheAwarePolicy two(CacheAwareConfig{.rendezvous_blocks = 2});
  const std::size_t x = two.choose(request_for(Chain{7, 8, 9}), fleet(8)).replica;
  for (BlockHash tail = 10; tail < 30; ++tail)
    CHECK(two.choose(request_for(Chain{7, 8, tail}), fleet(8)).replica == x);
}

TEST_CASE("load events parse; unknown event types are ignored, not malformed") {
  const KvEventMessage e = parse_kv_event(R"({"type":"load","waiting":3,"running":5,"kv_usage":0.25})");
  CHECK(e.type == KvEventMessage::Type::load);
  CHECK(e.waiting == 3);
  CHECK(e.running == 5);
  CHECK(e.kv_usage == doctest::Approx(0.25));
  CHECK_THROWS_AS(parse_kv_event(R"({"type":"load","waiting":3,"running":5,"kv_usage":2})"), std::invalid_argument);
  CHECK_THROWS_AS(parse_kv_event(R"({"type":"load","waiting":-1,"running":5,"kv_usage":0})"), std::invalid_argument);
  Index f;
  CHECK(f.feed(0, R"({"type":"load","waiting":1,"running":1,"kv_usage":0})").status == EventStatus::ignored);
  CHECK(f.feed(0, R"({"type":"future_thing","whatever":[1]})").status == EventStatus::ignored);
  CHECK(f.feed(0, R"({"seq":1,"type":"stored","block_hashes":[1],"parent":null})").status == EventStatus::applied);
}

TEST_CASE("cache_aware knobs as flags: written into the policy, rejected for another policy") {
  const char* argv[] = {"kvfleet-router", "--model", "/m", "--cache-threshold", "0.7", "--new-prefix-slack", "5",
                        "--load-weight", "0.3"};
  const RouterConfig c = parse_router_args(std::size(argv), argv, nullptr);
  REQUIRE(c.policy.IsMap());
  CHECK(c.policy["name"].as<std::string>() == "cache_aware");
  CHECK(c.policy["cache_threshold"].as<double>() == doctest::Approx(0.7));
  CHECK(c.policy["new_prefix_slack"].as<int>() == 5);
  const char* bad_value[] = {"kvfleet-router", "--model", "/m", "--cache-threshold", "7"};
  CHECK_THROWS_WITH_AS(parse_router_args(std::size(bad_value), bad_value, nullptr),
                       doctest::Contains("knob 'cache_threshold' must be in [0, 1]"), std::invalid_argument);
  const char* other[] = {"kvfleet-router", "--model", "/m", "--policy", "round_robin", "--load-weight", "1"};
  CHECK_THROWS_WITH_AS(parse_router_args(std::size(other), other, nullptr),
                       doctest::Contains("is a cache_aware knob, but the policy is 'round_robin'"), std::invalid_argument);
  RouterConfig y;
  apply_router_yaml("discovery: {dns: 'replicas.kvfleet:8000', interval_ms: 250}\npending_ttl_ms: 5000\n", "t.yaml", y);
  CHECK(y.discovery.dns == "replicas.kvfleet:8000");
  CHECK(y.discovery.interval.count() == 250);
  CHECK(y.pending_ttl.count() == 5000);
  CHECK_THROWS_AS(apply_router_yaml("discovery: {dns: x, every: 1}\n", "t.yaml", y), std::invalid_argument);
  const char* bad_dns[] = {"kvfleet-router", "--model", "/m", "--discovery-dns", "no-port"};
  CHECK_THROWS_WITH_AS(parse_router_args(std::size(bad_dns), bad_dns, nullptr), doctest::Contains("NAME:PORT"),
                       std::invalid_argument);
}

TEST_CASE("discovery: resolvers and the set handed to the gateway") {
  CHECK(Discovery::to_urls({"127.0.0.3", "127.0.0.2", "127.0.0.3", "::1"}, 9000) ==
        std::vector<std::string>{"http://127.0.0.2:9000", "http://127.0.0.3:9000", "http://[::1]:9000"});
  const std::vector<std::string> local = Discovery::system_resolver()("localhost");
  CHECK(std::find(local.begin(), local.end(), "127.0.0.1") != local.end());
  CHECK_THROWS_AS(Discovery::system_resolver()("no-such-host.invalid"), std::runtime_error);
  test::TempDir dir;
  const auto hosts = dir / "hosts";
  std::ofstream(hosts) << "# test hosts\n127.0.0.2 replicas.test other\n127.0.0.3 REPLICAS.test # two\n10.0.0.1 x\n";
  CHECK(Discovery::hosts_file_resolver(hosts.string())("replicas.test") ==
        std::vector<std::string>{"127.0.0.2", "127.0.0.3"});
  CHECK_THROWS_AS(Discovery::hosts_file_resolver(hosts.string())("missing"), std::runtime_error);

  // An injected resolver: each answer reaches `apply` whole; a failure keeps the last set (no call).
  std::mutex mu;
  std::vector<std::vector<std::string>> applied;
  std::atomic<int> calls{0};
  Discovery d(RouterConfig::Discovery{.dns = "fleet:7000", .interval = std::chrono::milliseconds(5)},
              [&](const std::string& name) -> std::vector<std::string> {
                CHECK(name == "fleet");
                const int n = calls++;
                if (n == 1) throw std::runtime_error("SERVFAIL");
                return n == 0 ? std::vector<std::string>{"127.0.0.2"} : std::vector<std::string>{"127.0.0.2", "127.0.0.4"};
              },
              [&](const std::vector<std::string>& urls) {
                std::lock_guard lock(mu);
                applied.push_back(urls);
              });
  d.start();
  // Wait for the second set to be applied, not for the third call: the call counter moves before its
  // answer reaches `apply` (a flake in a loaded fresh-clone run).
  const auto applied_count = [&] {
    std::lock_guard lock(mu);
    return applied.size();
  };
  for (int i = 0; i < 400 && applied_count() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::lock_guard lock(mu);
  REQUIRE(applied.size() >= 2);
  CHECK(applied[0] == std::vector<std::string>{"http://127.0.0.2:7000"});
  CHECK(applied[1] == std::vector<std::string>{"http://127.0.0.2:7000", "http://127.0.0.4:7000"});
}
