#include <doctest/doctest.h>

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "router/replica_cache_index.h"

using namespace kvfleet;
using namespace kvfleet::router;

namespace {

using Chain = std::vector<BlockHash>;
constexpr BlockHash kRootHash = 0xABCDEF;

struct Fixture {
  std::vector<std::string> logged;
  ReplicaCacheIndex index{ReplicaCacheConfig{.block_size = 16, .root = kRootHash, .approximate_ttl = 100},
                          [this](std::string_view line) { logged.emplace_back(line); }};

  Fixture() { index.add_replica(0); }
  EventOutcome feed(const std::string& json, Tick now = 1) { return index.apply_event(0, json, now); }
  std::uint32_t matched(const Chain& c) const { return index.match(c).of(0); }
  void open_exact() {
    index.begin_stream(0);
    REQUIRE(feed(R"({"type":"config","seq":0,"block_size":16,"root":11259375})").status == EventStatus::config_accepted);
  }
};

std::string stored(std::uint64_t seq, const std::string& hashes, const std::string& parent) {
  return R"({"seq":)" + std::to_string(seq) + R"(,"type":"stored","block_hashes":[)" + hashes + R"(],"parent":)" +
         parent + R"(,"tier":"gpu"})";
}

std::string removed(std::uint64_t seq, const std::string& hashes) {
  return R"({"seq":)" + std::to_string(seq) + R"(,"type":"removed","block_hashes":[)" + hashes + "]}";
}

}  // namespace

TEST_CASE("approximate mode: routed prompts are inserted and age out after the TTL") {
  Fixture f;
  CHECK(f.index.mode(0) == CacheMode::approximate);
  CHECK(f.index.mode_reason(0) == "no event stream yet");
  f.index.on_routed(0, Chain{1, 2, 3}, 1000);
  f.index.on_routed(0, Chain{1, 2, 4}, 1050);
  CHECK(f.matched(Chain{1, 2, 3}) == 3);
  CHECK(f.index.sweep(1100) == 0);  // cutoff 1000: last use 1000 is not before it
  CHECK(f.index.sweep(1101) == 1);  // [3] goes; [1 2] and [4] were used at 1050
  CHECK(f.matched(Chain{1, 2, 3}) == 2);
  CHECK(f.matched(Chain{1, 2, 4}) == 3);
  CHECK(f.index.sweep(1151) == 2);
  CHECK(f.index.tree().stats().nodes == 0);
}

TEST_CASE("exact mode: stored, removed and cleared events drive the tree; routing leaves pending marks") {
  Fixture f;
  f.open_exact();
  CHECK(f.index.mode(0) == CacheMode::exact);
  CHECK(f.feed(stored(1, "11,12", "11259375")).status == EventStatus::applied);  // parent = the root
  CHECK(f.feed(stored(2, "13", "12")).status == EventStatus::applied);
  CHECK(f.matched(Chain{11, 12, 13, 14}) == 3);
  CHECK(f.feed(removed(3, "12")).status == EventStatus::applied);  // 13 goes with it
  CHECK(f.matched(Chain{11, 12, 13}) == 1);
  CHECK(f.index.last_seq(0) == 3);
  f.index.on_routed(0, Chain{11, 50}, 500);
  CHECK(f.matched(Chain{11, 50}) == 2);  // 50 is pending: the replica is computing it
  CHECK(f.index.pending_blocks() == 1);
  CHECK(f.index.tree().last_used(0, 11) == 500);
  CHECK(f.index.sweep(100000) == 0);  // no approximate mark; the pending one expired unconfirmed
  CHECK(f.matched(Chain{11, 50}) == 1);
  CHECK(f.index.pending_expired() == 1);
  CHECK(f.feed(R"({"seq":40,"type":"cleared"})").status == EventStatus::applied);  // any seq
  CHECK(f.matched(Chain{11}) == 0);
  CHECK(f.feed(stored(41, "21", "null")).status == EventStatus::applied);
  CHECK(f.matched(Chain{21}) == 1);
}

TEST_CASE("events about a KV tier below the device pool count their seq and go to the tier index, not the tree") {
  Fixture f;
  f.open_exact();
  CHECK(f.feed(stored(1, "11,12", "11259375")).status == EventStatus::applied);
  // 12 leaves the device pool for host memory: the host's stored comes first, then the device's removed.
  CHECK(f.feed(R"({"seq":2,"type":"stored","block_hashes":[12],"parent":11,"medium":"host"})").status ==
        EventStatus::applied);
  CHECK(f.feed(removed(3, "12")).status == EventStatus::applied);
  CHECK(f.matched(Chain{11, 12}) == 1);
  CHECK(f.index.match_tiers(Chain{11, 12}, f.index.match(Chain{11, 12})).of(0, Medium::host) == 1);
  CHECK(f.feed(R"({"seq":4,"type":"removed","block_hashes":[11],"medium":"disk"})").status == EventStatus::applied);
  CHECK(f.matched(Chain{11, 12}) == 1);  // still on the device
  CHECK(f.feed(R"({"seq":5,"type":"stored","block_hashes":[12],"parent":11,"medium":"device"})").status ==
        EventStatus::applied);
  CHECK(f.matched(Chain{11, 12}) == 2);
  CHECK(f.index.last_seq(0) == 5);
  CHECK(f.feed(R"({"seq":6,"type":"stored","block_hashes":[13],"parent":12,"medium":7})").status != EventStatus::applied);
}

TEST_CASE("a seq gap stops the stream and asks for a resync from the last applied seq") {
  Fixture f;
  f.open_exact();
  REQUIRE(f.feed(stored(1, "11", "11259375")).status == EventStatus::applied);
  CHECK(f.feed(stored(1, "11", "11259375")).status == EventStatus::ignored);  // replay overlap
  const EventOutcome gap = f.feed(stored(3, "13", "12"));
  CHECK(gap.status == EventStatus::resync_needed);
  CHECK(gap.resume_from == 1);
  CHECK(gap.message == "seq gap: expected 2, got 3");
  CHECK(f.matched(Chain{11, 12, 13}) == 1);  // not applied
  const EventOutcome after = f.feed(stored(2, "12", "11"));
  CHECK(after.status == EventStatus::ignored);  // the stream is untrusted until a new config
  CHECK(after.message == "no accepted config on this stream");
  CHECK(f.index.mode(0) == CacheMode::exact);   // the marks are still right up to seq 1
  // Reconnect: since=1 keeps the marks; the replay fills the gap.
  CHECK(f.index.begin_stream(0) == 1);
  CHECK(f.feed(R"({"type":"config","seq":3,"block_size":16,"root":"0xabcdef"})").status == EventStatus::config_accepted);
  CHECK(f.feed(stored(2, "12", "11")).status == EventStatus::applied);
  CHECK(f.feed(stored(3, "13", "12")).status == EventStatus::applied);
  CHECK(f.matched(Chain{11, 12, 13}) == 3);
}

TEST_CASE("a config mismatch keeps the replica approximate, with the reason logged") {
  Fixture f;
  f.index.begin_stream(0);
  EventOutcome o = f.feed(R"({"type":"config","seq":0,"block_size":32,"root":11259375})");
  CHECK(o.status == EventStatus::config_rejected);
  CHECK(o.message == "config mismatch: block_size 32 differs from the router's 16");
  CHECK(f.index.mode(0) == CacheMode::approximate);
  CHECK(f.index.mode_reason(0) == o.message);
  REQUIRE(f.logged.size() == 1);
  CHECK(f.logged[0] == "replica 0: approximate mode (config mismatch: block_size 32 differs from the router's 16)");
  CHECK(f.feed(stored(1, "11", "11259375")).status == EventStatus::ignored);
  CHECK(f.matched(Chain{11}) == 0);
  o = f.feed(R"({"type":"config","seq":0,"block_size":16,"root":1})");
  CHECK(o.status == EventStatus::config_rejected);
  CHECK(o.message ==
        "config mismatch: root 0x0000000000000001 differs from the router's 0x0000000000abcdef (different model "
        "name or hashing)");
  f.index.on_routed(0, Chain{7, 8}, 5);  // approximate: the guess goes in
  CHECK(f.matched(Chain{7, 8}) == 2);
}

TEST_CASE("guesses made while approximate are dropped before an exact stream starts") {
  Fixture f;
  f.index.on_routed(0, Chain{1, 2}, 5);
  CHECK(f.index.begin_stream(0) == 0);
  CHECK(f.matched(Chain{1, 2}) == 0);
  f.open_exact();
  REQUIRE(f.feed(stored(1, "11", "null")).status == EventStatus::applied);
  // The stream drops: approximate until it is back; without new guesses the marks stay usable.
  f.index.end_stream(0, "kv event stream closed");
  CHECK(f.index.mode(0) == CacheMode::approximate);
  CHECK(f.index.mode_reason(0) == "kv event stream closed");
  CHECK(f.index.begin_stream(0) == 1);
  CHECK(f.matched(Chain{11}) == 1);
  f.index.end_stream(0, "connect failed");
  f.index.on_routed(0, Chain{11, 12}, 6);
  CHECK(f.index.begin_stream(0) == 0);  // a guess was added: start over
  CHECK(f.matched(Chain{11}) == 0);
}

TEST_CASE("a config whose seq went back means the replica restarted: its marks are dropped") {
  Fixture f;
  f.open_exact();
  REQUIRE(f.feed(stored(1, "11", "null")).status == EventStatus::applied);
  REQUIRE(f.feed(stored(2, "12", "11")).status == EventStatus::applied);
  CHECK(f.index.begin_stream(0) == 2);
  CHECK(f.feed(R"({"type":"config","seq":0,"block_size":16,"root":11259375})").status == EventStatus::config_accepted);
  CHECK(f.matched(Chain{11, 12}) == 0);
  CHECK(f.index.last_seq(0) == 0);
  CHECK(f.feed(stored(1, "31", "null")).status == EventStatus::applied);
}

TEST_CASE("malformed events ask for a resync; the parser names the problem") {
  Fixture f;
  f.open_exact();
  EventOutcome o = f.feed("{not json");
  CHECK(o.status == EventStatus::resync_needed);
  CHECK(o.message.starts_with("malformed event: kv event: not JSON"));
  CHECK(o.resume_from == 0);
  CHECK_THROWS_WITH_AS(parse_kv_event(R"({"type":"stored","seq":1})"), "kv event: missing 'block_hashes'",
                       std::invalid_argument);
  CHECK(parse_kv_event(R"({"type":"evicted","seq":1})").type == KvEventMessage::Type::unknown);
  CHECK_THROWS_WITH_AS(parse_kv_event(R"({"type":"removed","seq":-1,"block_hashes":[]})"),
                       "kv event: 'seq' must be a non-negative integer", std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_kv_event(R"({"type":"removed","seq":1,"block_hashes":[1.5]})"),
                       "kv event: 'block_hashes' must be an unsigned 64-bit integer or a numeric string",
                       std::invalid_argument);
  const KvEventMessage e =
      parse_kv_event(R"({"seq":9,"type":"stored","block_hashes":[18446744073709551615,-1,"0x10","17"],"parent":null})");
  CHECK(e.type == KvEventMessage::Type::stored);
  CHECK(e.seq == 9);
  CHECK(e.block_hashes == Chain{~0ull, ~0ull, 16, 17});
  CHECK_FALSE(e.parent.has_value());
}

TEST_CASE("events carrying real Contract 1 hashes match the router's own hashes of the prompt") {
  const BlockHash root = block_hash_root("tiny-llama");
  ReplicaCacheIndex index(ReplicaCacheConfig{.block_size = 16, .root = root});
  index.add_replica(3);
  index.begin_stream(3);
  const std::string config = R"({"type":"config","seq":0,"block_size":16,"root":)" + std::to_string(root) + "}";
  REQUIRE(index.apply_event(3, config, 1).status == EventStatus::config_accepted);
  std::vector<TokenId> tokens(100);
  std::iota(tokens.begin(), tokens.end(), 0);
  const Chain h = block_hashes(root, tokens, 16);  // 6 full blocks
  // The replica cached the first 4 blocks in two runs.
  REQUIRE(index.apply_event(3, stored(1, std::to_string(h[0]) + "," + std::to_string(h[1]), std::to_string(root)), 1).status ==
          EventStatus::applied);
  REQUIRE(index.apply_event(3, stored(2, std::to_string(h[2]) + "," + std::to_string(h[3]), std::to_string(h[1])), 1).status ==
          EventStatus::applied);
  CHECK(index.match(h).of(3) == 4);
  index.remove_replica(3);
  CHECK(index.match(h).of(3) == 0);
  CHECK_THROWS_AS(index.mode(3), std::out_of_range);
  CHECK_THROWS_AS(index.add_replica(64), std::out_of_range);
}

namespace {

std::string config_event(std::uint64_t seq, std::uint64_t instance) {
  return R"({"type":"config","seq":)" + std::to_string(seq) + R"(,"block_size":16,"root":11259375,"instance":)" +
         std::to_string(instance) + "}";
}

std::string snapshot_block(std::uint64_t seq, BlockHash h, const std::string& parent) {
  return R"({"seq":)" + std::to_string(seq) + R"(,"type":"stored","snapshot":true,"block_hashes":[)" +
         std::to_string(h) + R"(],"parent":)" + parent + "}";
}

}  // namespace

TEST_CASE("a router that fell behind the ring applies the whole snapshot after cleared") {
  Fixture f;
  f.index.begin_stream(0);
  REQUIRE(f.feed(config_event(0, 7)).status == EventStatus::config_accepted);
  REQUIRE(f.feed(stored(1, "91", "null")).status == EventStatus::applied);
  // Reconnect since=1; the replica's ring no longer reaches back: cleared + snapshot at seq 100.
  CHECK(f.index.begin_stream(0) == 1);
  REQUIRE(f.feed(config_event(100, 7)).status == EventStatus::config_accepted);
  CHECK(f.feed(R"({"seq":100,"type":"cleared","snapshot":3})").status == EventStatus::applied);
  CHECK(f.index.in_snapshot(0));
  CHECK(f.feed(snapshot_block(100, 11, "11259375")).status == EventStatus::applied);
  CHECK(f.feed(snapshot_block(100, 12, "11")).status == EventStatus::applied);
  CHECK(f.feed(snapshot_block(100, 13, "12")).status == EventStatus::applied);
  CHECK_FALSE(f.index.in_snapshot(0));
  CHECK(f.matched(Chain{11, 12, 13}) == 3);
  CHECK(f.matched(Chain{91}) == 0);  // cleared
  CHECK(f.feed(stored(100, "14", "13")).status == EventStatus::ignored);  // a replay of seq 100 now
  CHECK(f.feed(stored(101, "14", "13")).status == EventStatus::applied);
  CHECK(f.matched(Chain{11, 12, 13, 14}) == 4);
  CHECK(f.index.last_seq(0) == 101);
}

TEST_CASE("an interrupted or short snapshot is not trusted: the next stream starts from 0") {
  Fixture f;
  f.index.begin_stream(0);
  REQUIRE(f.feed(config_event(50, 7)).status == EventStatus::config_accepted);
  REQUIRE(f.feed(R"({"seq":50,"type":"cleared","snapshot":2})").status == EventStatus::applied);
  REQUIRE(f.feed(snapshot_block(50, 11, "null")).status == EventStatus::applied);
  f.index.end_stream(0, "stream closed");
  CHECK(f.index.begin_stream(0) == 0);
  CHECK(f.matched(Chain{11}) == 0);
  REQUIRE(f.feed(config_event(50, 7)).status == EventStatus::config_accepted);
  REQUIRE(f.feed(R"({"seq":50,"type":"cleared","snapshot":2})").status == EventStatus::applied);
  REQUIRE(f.feed(snapshot_block(50, 11, "null")).status == EventStatus::applied);
  const EventOutcome o = f.feed(stored(51, "12", "11"));  // the snapshot said 2 blocks
  CHECK(o.status == EventStatus::resync_needed);
  CHECK(o.message == "snapshot at seq 50 ended with 1 blocks missing");
  CHECK(f.index.begin_stream(0) == 0);
}

TEST_CASE("a new instance id drops the marks and restarts from 0 even when its seq passed ours") {
  Fixture f;
  f.index.begin_stream(0);
  REQUIRE(f.feed(config_event(0, 7)).status == EventStatus::config_accepted);
  REQUIRE(f.feed(stored(1, "11", "null")).status == EventStatus::applied);
  REQUIRE(f.feed(stored(2, "12", "11")).status == EventStatus::applied);
  CHECK(f.index.begin_stream(0) == 2);
  // The replica restarted and already published 40 events: seq 40 > since 2, but another instance.
  const EventOutcome o = f.feed(config_event(40, 8));
  CHECK(o.status == EventStatus::resync_needed);
  CHECK(o.resume_from == 0);
  CHECK(f.matched(Chain{11}) == 0);
  CHECK(f.index.mode(0) == CacheMode::approximate);
  CHECK(f.index.begin_stream(0) == 0);
  REQUIRE(f.feed(config_event(40, 8)).status == EventStatus::config_accepted);
  CHECK(f.feed(stored(1, "21", "null")).status == EventStatus::applied);
  CHECK(f.matched(Chain{21}) == 1);
  // The same instance again keeps the marks.
  CHECK(f.index.begin_stream(0) == 1);
  REQUIRE(f.feed(config_event(40, 8)).status == EventStatus::config_accepted);
  CHECK(f.matched(Chain{21}) == 1);
}

TEST_CASE("a chain under an unknown parent is dropped and counted; split events apply in full") {
  Fixture f;
  f.open_exact();
  CHECK(f.feed(stored(1, "31,32", "999")).status == EventStatus::applied);
  CHECK(f.index.orphans_dropped(0) == 1);
  CHECK(f.index.tree().stats().nodes == 0);
  KvEventMessage big;
  big.type = KvEventMessage::Type::stored;
  big.seq = 2;
  for (BlockHash h = 100; h < 110; ++h) big.block_hashes.push_back(h);
  const std::vector<KvEventMessage> pieces = split_kv_event(big, 3);
  REQUIRE(pieces.size() == 4);
  CHECK(pieces[1].continuation);
  CHECK(pieces[1].parent == std::optional<BlockHash>(102));
  for (const auto& p : pieces) CHECK(f.index.apply_event(0, p, 1).status == EventStatus::applied);
  Chain all(big.block_hashes);
  CHECK(f.matched(all) == 10);
  CHECK(f.index.last_seq(0) == 2);
  std::string many;
  for (std::size_t i = 0; i <= kMaxEventHashes; ++i) many += (i ? ",1" : "1");
  CHECK_THROWS_WITH_AS(parse_kv_event(R"({"type":"removed","seq":1,"block_hashes":[)" + many + "]}"),
                       "kv event: 'block_hashes' has 65537 entries, more than 65536", std::invalid_argument);
}
