// ReplicaCacheIndex with the ranks of an expert-parallel replica (replica_cache_index.h, "Ranks"): one
// per-rank stream feeds one tree slot per rank; the stream's state stays the replica's.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "router/replica_cache_index.h"

using namespace kvfleet;
using namespace kvfleet::router;

namespace {

using Chain = std::vector<BlockHash>;
constexpr BlockHash kRootHash = 0xABCDEF;  // 11259375

struct Fixture {
  ReplicaCacheIndex index{ReplicaCacheConfig{.block_size = 16, .root = kRootHash, .approximate_ttl = 100}};

  Fixture() {
    index.add_replica(0);
    index.add_replica(1);  // a plain replica in the same fleet
  }
  EventOutcome feed(const std::string& json, Tick now = 1) { return index.apply_event(0, json, now); }
  std::uint32_t matched(ReplicaId slot, const Chain& c) const { return index.match(c).of(slot); }
  // Replica 0 opens a per-rank stream with `ranks` ranks; returns their slots.
  std::vector<ReplicaId> open_ranked(std::uint32_t ranks) {
    const KvEventMessage config = parse_kv_event(R"({"type":"config","seq":0,"block_size":16,"root":11259375,"dp_size":)" +
                                                 std::to_string(ranks) + R"(,"per_rank":true})");
    REQUIRE(config.dp_size == ranks);
    REQUIRE(config.per_rank);
    const std::vector<ReplicaId> slots = index.set_ranks(0, config.dp_size);
    index.begin_stream(0);
    REQUIRE(index.apply_event(0, config, 1).status == EventStatus::config_accepted);
    return slots;
  }
};

std::string stored(std::uint64_t seq, const std::string& hashes, const std::string& parent, int rank) {
  return R"({"seq":)" + std::to_string(seq) + R"(,"type":"stored","block_hashes":[)" + hashes + R"(],"parent":)" +
         parent + R"(,"dp_rank":)" + std::to_string(rank) + "}";
}

std::string removed(std::uint64_t seq, const std::string& hashes, int rank) {
  return R"({"seq":)" + std::to_string(seq) + R"(,"type":"removed","block_hashes":[)" + hashes + R"(],"dp_rank":)" +
         std::to_string(rank) + "}";
}

}  // namespace

TEST_CASE("kv events: dp_rank, dp_size and per_rank are read; bad ones are refused") {
  const KvEventMessage s = parse_kv_event(stored(3, "1", "null", 2));
  CHECK(s.dp_rank == 2);
  CHECK(parse_kv_event(R"({"seq":1,"type":"stored","block_hashes":[1]})").dp_rank == -1);
  const KvEventMessage load = parse_kv_event(R"({"type":"load","waiting":1,"running":2,"kv_usage":0.5,"dp_rank":1})");
  CHECK(load.dp_rank == 1);
  const KvEventMessage plain = parse_kv_event(R"({"type":"config","seq":0,"block_size":16,"root":1})");
  CHECK(plain.dp_size == 1);
  CHECK_FALSE(plain.per_rank);
  CHECK_THROWS_AS(parse_kv_event(stored(1, "1", "null", -1)), std::invalid_argument);
  CHECK_THROWS_AS(parse_kv_event(R"({"seq":1,"type":"stored","block_hashes":[1],"dp_rank":"x"})"), std::invalid_argument);
  CHECK_THROWS_AS(parse_kv_event(R"({"type":"config","seq":0,"block_size":16,"root":1,"dp_size":0})"), std::invalid_argument);
  CHECK_THROWS_AS(parse_kv_event(R"({"type":"config","seq":0,"block_size":16,"root":1,"per_rank":1})"), std::invalid_argument);
}

TEST_CASE("a per-rank stream puts each rank's blocks on its own slot; a plain replica beside it is unchanged") {
  Fixture f;
  const std::vector<ReplicaId> slots = f.open_ranked(2);
  REQUIRE(slots.size() == 2);
  CHECK(slots[0] == 0);
  CHECK(slots[1] == 2);  // slot 1 is the plain replica's
  CHECK(f.index.in_use(2));
  CHECK(f.index.mode(slots[1]) == CacheMode::exact);  // the rank follows its replica's stream
  CHECK(f.feed(stored(1, "11,12", "11259375", 1)).status == EventStatus::applied);
  CHECK(f.feed(stored(2, "11", "11259375", 0)).status == EventStatus::applied);
  CHECK(f.matched(slots[1], {11, 12, 13}) == 2);
  CHECK(f.matched(slots[0], {11, 12, 13}) == 1);
  CHECK(f.matched(1, {11, 12}) == 0);
  // Rank 1 drops 12; rank 0 still holds 11 and rank 1 too.
  CHECK(f.feed(removed(3, "12", 1)).status == EventStatus::applied);
  CHECK(f.matched(slots[1], {11, 12}) == 1);
  CHECK(f.matched(slots[0], {11}) == 1);
  CHECK(f.index.last_seq(0) == 3);
  // Routing to a rank leaves its pending marks on that rank; its stored event confirms them.
  f.index.on_routed(slots[1], Chain{11, 40}, 10);
  CHECK(f.matched(slots[1], {11, 40}) == 2);
  CHECK(f.matched(slots[0], {11, 40}) == 1);
  CHECK(f.feed(stored(4, "40", "11", 1)).status == EventStatus::applied);
  CHECK(f.index.pending_confirmed() == 1);
  // The plain replica: events without dp_rank, as before.
  f.index.begin_stream(1);
  REQUIRE(f.index.apply_event(1, R"({"type":"config","seq":0,"block_size":16,"root":11259375})", 1).status ==
          EventStatus::config_accepted);
  CHECK(f.index.apply_event(1, R"({"seq":1,"type":"stored","block_hashes":[11,12],"parent":null})", 1).status ==
        EventStatus::applied);
  CHECK(f.matched(1, {11, 12}) == 2);
  CHECK(f.index.ranks(1).empty());
}

TEST_CASE("a cleared, a snapshot and a removal apply to every rank of the replica") {
  Fixture f;
  const std::vector<ReplicaId> slots = f.open_ranked(3);
  REQUIRE(slots.size() == 3);
  CHECK(f.feed(stored(1, "11", "null", 1)).status == EventStatus::applied);
  CHECK(f.feed(stored(2, "21", "null", 2)).status == EventStatus::applied);
  // A snapshot names each block's rank.
  CHECK(f.feed(R"({"seq":9,"type":"cleared","snapshot":2})").status == EventStatus::applied);
  CHECK(f.matched(slots[1], {11}) == 0);
  CHECK(f.matched(slots[2], {21}) == 0);
  CHECK(f.feed(R"({"seq":9,"type":"stored","block_hashes":[31],"parent":null,"snapshot":true,"dp_rank":2})").status ==
        EventStatus::applied);
  CHECK(f.feed(R"({"seq":9,"type":"stored","block_hashes":[32],"parent":31,"snapshot":true,"dp_rank":2})").status ==
        EventStatus::applied);
  CHECK_FALSE(f.index.in_snapshot(0));
  CHECK(f.matched(slots[2], {31, 32}) == 2);
  CHECK(f.matched(slots[0], {31}) == 0);
  f.index.remove_replica(0);
  CHECK_FALSE(f.index.in_use(slots[1]));
  CHECK_FALSE(f.index.in_use(slots[2]));
  CHECK(f.index.tree().stats().entries == 0);
  f.index.add_replica(slots[2]);  // a freed rank slot is free for a new replica
}

TEST_CASE("a dp_rank out of range, or missing on a per-rank stream, asks for a resync before its seq counts") {
  Fixture f;
  f.open_ranked(2);
  CHECK(f.feed(stored(1, "11", "null", 0)).status == EventStatus::applied);
  const EventOutcome out = f.feed(stored(2, "12", "11", 2));
  CHECK(out.status == EventStatus::resync_needed);
  CHECK(out.resume_from == 1);  // seq 2 was not applied: the replay sends it again
  CHECK(out.message.find("dp_rank 2 out of range") != std::string::npos);
  f.index.begin_stream(0);
  REQUIRE(f.feed(R"({"type":"config","seq":1,"block_size":16,"root":11259375,"dp_size":2,"per_rank":true})").status ==
          EventStatus::config_accepted);
  CHECK(f.feed(R"({"seq":2,"type":"stored","block_hashes":[12],"parent":11})").status == EventStatus::resync_needed);
}

TEST_CASE("without ranks dp_rank is ignored (the union stream); a new shape starts the ranks over") {
  Fixture f;
  f.index.begin_stream(0);
  REQUIRE(f.feed(R"({"type":"config","seq":0,"block_size":16,"root":11259375,"dp_size":2})").status ==
          EventStatus::config_accepted);
  CHECK(f.feed(stored(1, "11", "null", 1)).status == EventStatus::applied);
  CHECK(f.matched(0, {11}) == 1);  // the replica as one target
  CHECK(f.index.set_ranks(0, 1).empty());
  const std::vector<ReplicaId> two = f.index.set_ranks(0, 2);
  CHECK(two.size() == 2);
  CHECK(f.matched(0, {11}) == 0);  // a new shape: the marks go
  CHECK(f.index.set_ranks(0, 2) == two);  // the same shape: nothing changes
  const std::vector<ReplicaId> four = f.index.set_ranks(0, 4);
  CHECK(four.size() == 4);
  CHECK(f.index.set_ranks(0, 0).empty());
  CHECK_FALSE(f.index.in_use(four[3]));
  // Too few slots: refused, nothing changes.
  for (ReplicaId s = 2; s < kMaxReplicas; ++s) f.index.add_replica(s);
  CHECK_THROWS_AS(f.index.set_ranks(0, 2), std::out_of_range);
  CHECK(f.index.ranks(0).empty());
}
