#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "router/policies/cache_aware.h"
#include "router/replica_cache_index.h"
#include "router/tier_index.h"

using namespace kvfleet;
using namespace kvfleet::router;

namespace {

using Chain = std::vector<BlockHash>;
constexpr BlockHash kRootHash = 0xABCDEF;  // 11259375

MatchResult device(std::initializer_list<std::pair<ReplicaId, std::uint32_t>> held) {
  MatchResult m;
  for (const auto& [r, n] : held) m.blocks[r] = n;
  return m;
}

std::array<std::uint32_t, kNumMedia> by_medium(const TierMatch& m, ReplicaId r) { return m.blocks[r]; }
using Media = std::array<std::uint32_t, kNumMedia>;  // device, host, disk, shared

std::string event(std::uint64_t seq, const char* type, const std::string& hashes, const char* medium,
                  const std::string& parent = "11259375") {
  std::string e = R"({"seq":)" + std::to_string(seq) + R"(,"type":")" + type + R"(","block_hashes":[)" + hashes + "]";
  if (std::string(type) == "stored") e += R"(,"parent":)" + parent;
  if (medium != nullptr) e += R"(,"medium":")" + std::string(medium) + "\"";
  return e + "}";
}

std::string config(std::uint64_t seq, std::uint64_t shared = 0, std::uint64_t instance = 1) {
  std::string c = R"({"type":"config","seq":)" + std::to_string(seq) + R"(,"block_size":16,"root":11259375,"instance":)" +
                  std::to_string(instance);
  if (shared != 0) c += R"(,"shared_tier":)" + std::to_string(shared);
  return c + "}";
}

}  // namespace

TEST_CASE("tier index: a replica's walk is its device prefix, then host, disk or shared block after block") {
  TierIndex t;
  REQUIRE(t.set_shared(2, 77));
  t.stored(0, Medium::host, Chain{3, 4}, 1);
  t.stored(0, Medium::disk, Chain{4, 5, 7}, 1);  // 4 is in host and disk: host counts
  t.stored(1, Medium::disk, Chain{1, 2}, 1);
  t.stored_shared(2, Chain{1, 2, 3}, 1);
  const TierMatch m = t.match(Chain{1, 2, 3, 4, 5, 6, 7}, device({{0, 2}, {1, 0}}));
  CHECK(by_medium(m, 0) == Media{2, 2, 1, 0});  // 6 is nowhere: 7 is not reached
  CHECK(m.reachable(0) == 5);
  CHECK(by_medium(m, 1) == Media{0, 0, 2, 0});
  CHECK(by_medium(m, 2) == Media{0, 0, 0, 3});
  CHECK(by_medium(m, 3) == Media{0, 0, 0, 0});
  // Blocks the device pool holds count as device even when a lower tier has them too.
  t.stored(1, Medium::host, Chain{1}, 2);
  CHECK(by_medium(t.match(Chain{1, 2}, device({{1, 2}})), 1) == Media{2, 0, 0, 0});
}

TEST_CASE("tier index: a shared block counts for every replica naming the same shared tier, no other") {
  TierIndex t;
  REQUIRE(t.set_shared(0, 0xAA));
  REQUIRE(t.set_shared(1, 0xAA));
  REQUIRE(t.set_shared(2, 0xBB));
  t.stored_shared(0, Chain{10, 11}, 1);  // replica 0 wrote them
  const TierMatch m = t.match(Chain{10, 11, 12}, device({}));
  CHECK(m.of(0, Medium::shared) == 2);
  CHECK(m.of(1, Medium::shared) == 2);
  CHECK(m.of(2, Medium::shared) == 0);
  CHECK(t.count(1, Medium::shared) == 2);
  // Leaving the group (a replica restarted without the shared tier) ends it; the marks stay the group's.
  t.remove_replica(1);
  CHECK(t.match(Chain{10}, device({})).of(1, Medium::shared) == 0);
  CHECK(t.match(Chain{10}, device({})).of(0, Medium::shared) == 1);
  t.stored_shared(3, Chain{12}, 1);  // no shared tier: ignored
  CHECK(t.size() == 2);
}

TEST_CASE("tier index: removals are per block, clear_replica keeps the shared marks, the bound drops the oldest") {
  TierIndex t(TierIndexConfig{.max_blocks = 4, .evict_to = 0.5});
  REQUIRE(t.set_shared(0, 5));
  t.stored(0, Medium::host, Chain{1, 2, 3}, 10);
  t.removed(0, Medium::host, Chain{2});
  CHECK(t.match(Chain{1, 2, 3}, device({})).of(0, Medium::host) == 1);  // 3 is held but 2 is not: unreachable
  t.removed(0, Medium::disk, Chain{1});  // another medium: nothing
  CHECK(t.count(0, Medium::host) == 2);
  t.stored_shared(0, Chain{9}, 11);
  t.clear_replica(0);
  CHECK(t.count(0, Medium::host) == 0);
  CHECK(t.count(0, Medium::shared) == 1);
  CHECK(t.size() == 1);
  t.stored(1, Medium::disk, Chain{20, 21, 22}, 12);  // 4 entries: at the bound
  CHECK(t.size() == 4);
  t.stored(1, Medium::disk, Chain{23}, 13);  // 5 > 4: down to 2, the oldest first (9 at 11, then 20, 21)
  CHECK(t.size() == 2);
  CHECK(t.evicted() == 3);
  CHECK(t.count(0, Medium::shared) == 0);
  CHECK(t.count(1, Medium::disk) == 2);
  CHECK(t.match(Chain{23}, device({})).of(1, Medium::disk) == 1);  // the newest stays
}

TEST_CASE("replica cache index: tier events fill the tier index, device events the tree; cleared and restarts drop tiers") {
  ReplicaCacheIndex index{ReplicaCacheConfig{.block_size = 16, .root = kRootHash}};
  index.add_replica(0);
  index.add_replica(1);
  for (ReplicaId r : {0u, 1u}) {
    index.begin_stream(r);
    REQUIRE(index.apply_event(r, config(0, 0x5EED), 1).status == EventStatus::config_accepted);
  }
  // Replica 0 computed 1 2 3 and wrote them to the shared tier; its device pool evicted 3 into host.
  REQUIRE(index.apply_event(0, event(1, "stored", "1,2,3", nullptr), 1).status == EventStatus::applied);
  REQUIRE(index.apply_event(0, event(2, "stored", "1,2,3", "shared"), 1).status == EventStatus::applied);
  REQUIRE(index.apply_event(0, event(3, "stored", "3", "host", "2"), 2).status == EventStatus::applied);
  REQUIRE(index.apply_event(0, event(4, "removed", "3", nullptr), 2).status == EventStatus::applied);
  CHECK(index.last_seq(0) == 4);
  const Chain prompt{1, 2, 3};
  MatchResult dev = index.match(prompt);
  CHECK(dev.of(0) == 2);
  TierMatch m = index.match_tiers(prompt, dev);
  CHECK(m.blocks[0] == Media{2, 1, 0, 0});
  CHECK(m.blocks[1] == Media{0, 0, 0, 3});  // replica 1 mounts the same shared tier
  // An unknown medium counts its seq and nothing else.
  REQUIRE(index.apply_event(0, event(5, "stored", "7", "tape"), 3).status == EventStatus::applied);
  CHECK(index.last_seq(0) == 5);
  CHECK(index.tiers().size() == 3);
  // A cleared event drops replica 0's host marks (a snapshot lists the device pool only), not the shared ones.
  REQUIRE(index.apply_event(0, R"({"seq":9,"type":"cleared"})", 4).status == EventStatus::applied);
  m = index.match_tiers(prompt, index.match(prompt));
  CHECK(m.blocks[0] == Media{0, 0, 0, 3});
  // A replica that comes back without a shared tier leaves the group.
  index.begin_stream(1);
  REQUIRE(index.apply_event(1, config(0), 5).status == EventStatus::config_accepted);
  CHECK(index.match_tiers(prompt, index.match(prompt)).reachable(1) == 0);
  // Host and disk marks of a restarted replica go (a new instance).
  REQUIRE(index.apply_event(0, event(10, "stored", "1", "disk"), 6).status == EventStatus::applied);
  CHECK(index.tiers().count(0, Medium::disk) == 1);
  index.begin_stream(0);
  CHECK(index.apply_event(0, config(0, 0x5EED, 2), 7).status == EventStatus::resync_needed);  // since=10: start over
  CHECK(index.tiers().count(0, Medium::disk) == 0);
  CHECK(index.tiers().count(0, Medium::shared) == 3);
}

TEST_CASE("cache_aware: a match is weighed by tier; a cold replica loses to a host or shared hit") {
  CacheAwarePolicy policy;  // host 0.9, disk 0.7, shared 0.6
  const RoutingRequest request{.prompt_blocks = 10, .prompt_tokens = 160};
  std::vector<ReplicaState> fleet(3);
  for (std::size_t i = 0; i < fleet.size(); ++i) fleet[i].id = "r" + std::string(1, char('0' + i));
  // r0: 2 device + 8 host (evicted there); r1: cold; r2: 10 on device.
  fleet[0].matched_blocks = 2;
  fleet[0].host_blocks = 8;
  fleet[2].matched_blocks = 10;
  Decision d = policy.choose(request, fleet);
  CHECK(d.replica == 2);
  CHECK(d.reason == "cache_hit");
  fleet[2].matched_blocks = 0;
  d = policy.choose(request, fleet);
  CHECK(d.replica == 0);
  CHECK(d.reason == "tier_hit");
  // A shared-tier prefix: both members score alike; the less loaded one wins.
  fleet[0] = fleet[1] = ReplicaState{};
  fleet[0].id = "r0";
  fleet[1].id = "r1";
  fleet[0].shared_blocks = fleet[1].shared_blocks = 10;
  fleet[0].in_flight_requests = 1;
  d = policy.choose(request, fleet);
  CHECK(d.replica == 1);
  CHECK(d.reason == "tier_hit");
  // A disk hit (0.7 x 10) beats a shorter device hit (6).
  fleet[0] = ReplicaState{.id = "r0", .matched_blocks = 6};
  fleet[1] = ReplicaState{.id = "r1", .disk_blocks = 10};
  d = policy.choose(request, fleet);
  CHECK(d.replica == 1);
  // Weights 0: device blocks only (a tier hit is then not a candidate at all).
  YAML::Node knobs;
  knobs["host_tier_weight"] = 0;
  knobs["disk_tier_weight"] = 0;
  knobs["shared_tier_weight"] = 0;
  const auto device_only = CacheAwarePolicy::from_yaml(knobs);
  d = device_only->choose(request, fleet);
  CHECK(d.replica == 0);
  CHECK(d.reason == "cache_hit");
  fleet[0].matched_blocks = 0;
  CHECK(device_only->choose(request, fleet).reason != "tier_hit");
  knobs["host_tier_weight"] = 1.5;
  CHECK_THROWS_WITH_AS(CacheAwarePolicy::from_yaml(knobs), doctest::Contains("host_tier_weight"), std::invalid_argument);
}

TEST_CASE("replica cache index: a snapshot's tier entries restore the replica's host and disk marks") {
  ReplicaCacheIndex index{ReplicaCacheConfig{.block_size = 16, .root = kRootHash}};
  index.add_replica(0);
  index.begin_stream(0);
  REQUIRE(index.apply_event(0, config(7), 1).status == EventStatus::config_accepted);
  REQUIRE(index.apply_event(0, R"({"seq":7,"type":"cleared","snapshot":4})", 1).status == EventStatus::applied);
  for (const std::string& e : {std::string(R"({"seq":7,"type":"stored","block_hashes":[1],"parent":11259375,"snapshot":true})"),
                               std::string(R"({"seq":7,"type":"stored","block_hashes":[2],"parent":1,"snapshot":true,"medium":"host"})"),
                               std::string(R"({"seq":7,"type":"stored","block_hashes":[3],"parent":0,"snapshot":true,"medium":"disk"})"),
                               std::string(R"({"seq":7,"type":"stored","block_hashes":[2],"parent":0,"snapshot":true,"medium":"disk"})")})
    REQUIRE(index.apply_event(0, e, 2).status == EventStatus::applied);
  CHECK_FALSE(index.in_snapshot(0));
  const Chain prompt{1, 2, 3, 4};
  CHECK(index.match_tiers(prompt, index.match(prompt)).blocks[0] == Media{1, 1, 1, 0});
  CHECK(index.apply_event(0, event(8, "removed", "3", "disk"), 3).status == EventStatus::applied);
  CHECK(index.match_tiers(prompt, index.match(prompt)).reachable(0) == 2);
}
