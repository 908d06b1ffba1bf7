#include <doctest/doctest.h>

#include "kv_test_util.h"
#include "kvfleet/kv_cache_manager.h"

using namespace kvfleet;
using namespace kvfleet::test;
using Ids = std::vector<BlockId>;
using Hashes = std::vector<BlockHash>;

namespace {
const BlockHash kRoot = block_hash_root("tiny-llama");

KvCacheConfig config(std::int32_t num_blocks, bool prefix_caching = true) {
  KvCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = 4;
  c.root = kRoot;
  c.enable_prefix_caching = prefix_caching;
  c.event_ring_capacity = 16;
  return c;
}

std::string integrity(const KvCacheManager& kv, std::initializer_list<const Sequence*> live) {
  return kv.check_integrity(std::vector<const Sequence*>(live));
}

void compute_all(KvCacheManager& kv, Sequence& s) {
  s.num_computed_tokens = s.num_tokens();
  kv.commit(s);
}
}  // namespace

TEST_CASE("block ids, commit, tail-first free, revive, duplicate block, eviction order, events") {
  KvCacheManager kv(config(8));
  Sequence a = make_seq(1, iota_tokens(12));
  const Hashes ha = block_hashes(kRoot, a.tokens, 4);
  CHECK(kv.find_cached_prefix(a).empty());
  REQUIRE(kv.allocate(a, 12));
  CHECK(a.block_table == Ids{0, 1, 2});
  CHECK(kv.stats().usage == doctest::Approx(3.0 / 8));
  compute_all(kv, a);
  CHECK(a.num_cached_blocks == 3);
  {
    const KvReplay r = kv.events()->since(0);
    REQUIRE(r.events.size() == 1);
    CHECK(r.events[0].seq == 1);
    CHECK(r.events[0].type == KvEvent::Type::stored);
    CHECK(r.events[0].block_hashes == ha);
    CHECK(r.events[0].parent == kRoot);
  }
  kv.free(a);
  CHECK(kv.pool().free_list() == Ids{3, 4, 5, 6, 7, 2, 1, 0});
  CHECK(integrity(kv, {}) == "");

  // Same prompt again: the cache holds all 3 blocks, but the last token must be computed, so the
  // hit is 2 blocks; reviving 0 (tail) and 1 (middle) of the free list.
  Sequence e = make_seq(2, iota_tokens(12));
  const Ids prefix = kv.find_cached_prefix(e);
  CHECK(prefix == Ids{0, 1});
  REQUIRE(kv.allocate(e, 4, prefix));
  CHECK(e.block_table == Ids{0, 1, 3});
  CHECK(e.num_computed_tokens == 8);
  CHECK(kv.pool().free_list() == Ids{4, 5, 6, 7, 2});
  CHECK(kv.stats().prefix_query_tokens == 24);
  CHECK(kv.stats().prefix_hit_tokens == 8);
  // e's third block duplicates block 2: the hash is taken, so block 3 stays private, no event.
  compute_all(kv, e);
  CHECK_FALSE(kv.cache().is_cached(3));
  CHECK(kv.events()->last_seq() == 1);
  CHECK(integrity(kv, {&e}) == "");

  // 20 new tokens need 5 blocks: the 4 uncached ones, then the LRU head, block 2 (evicted).
  Sequence c = make_seq(3, iota_tokens(20, 100));
  REQUIRE(kv.allocate(c, 20));
  CHECK(c.block_table == Ids{4, 5, 6, 7, 2});
  CHECK(kv.stats().evicted_blocks == 1);
  CHECK(kv.events()->since(1).events.at(0).block_hashes == Hashes{ha[2]});
  CHECK(kv.events()->since(1).events.at(0).type == KvEvent::Type::removed);
  CHECK(kv.stats().usage == 1.0);

  Sequence d = make_seq(4, iota_tokens(4, 500));
  CHECK_FALSE(kv.can_allocate(d, 4));
  CHECK_FALSE(kv.allocate(d, 4));
  CHECK(d.block_table.empty());

  kv.free(e);  // 3 holds nothing cached: front; then 1, 0 (cached) at the back
  CHECK(kv.pool().free_list() == Ids{3, 1, 0});
  REQUIRE(kv.allocate(d, 4));
  CHECK(d.block_table == Ids{3});
  Sequence f = make_seq(5, iota_tokens(8, 900));
  REQUIRE(kv.allocate(f, 8));
  CHECK(f.block_table == Ids{1, 0});  // the tail block of the old prompt is evicted first
  const KvReplay r = kv.events()->since(2);
  REQUIRE(r.events.size() == 1);
  CHECK(r.events[0].seq == 3);
  CHECK(r.events[0].block_hashes == Hashes{ha[1], ha[0]});
  CHECK(kv.stats().evicted_blocks == 3);
  CHECK(kv.cache().size() == 0);
  CHECK(integrity(kv, {&c, &d, &f}) == "");

  for (Sequence* s : {&c, &d, &f}) kv.free(*s);
  CHECK(kv.pool().num_free() == 8);
  CHECK(integrity(kv, {}) == "");
}

TEST_CASE("a revived free block is not counted as free for the new blocks of the same sequence") {
  KvCacheManager kv(config(4));
  Sequence a = make_seq(1, iota_tokens(8));
  REQUIRE(kv.allocate(a, 8));
  compute_all(kv, a);
  kv.free(a);
  REQUIRE(kv.pool().free_list() == Ids{2, 3, 1, 0});

  Sequence b = make_seq(2, iota_tokens(20));  // blocks 0, 1 cached; needs 3 more, only 2 remain
  const Ids prefix = kv.find_cached_prefix(b);
  REQUIRE(prefix == Ids{0, 1});
  CHECK_FALSE(kv.can_allocate(b, 12, prefix));
  CHECK_FALSE(kv.allocate(b, 12, prefix));
  CHECK(b.block_table.empty());
  CHECK(kv.pool().free_list() == Ids{2, 3, 1, 0});
  CHECK(kv.stats().prefix_query_tokens == 8);  // a failed admission is not counted

  Sequence c = make_seq(3, iota_tokens(16));
  REQUIRE(kv.allocate(c, 8, kv.find_cached_prefix(c)));
  CHECK(c.block_table == Ids{0, 1, 2, 3});
  CHECK(kv.stats().prefix_hit_tokens == 8);
  CHECK(integrity(kv, {&c}) == "");
}

TEST_CASE("a prompt of exactly one block gets no cache hit") {
  KvCacheManager kv(config(4));
  Sequence a = make_seq(1, iota_tokens(4));
  REQUIRE(kv.allocate(a, 4));
  compute_all(kv, a);
  Sequence b = make_seq(2, iota_tokens(4));
  CHECK(kv.find_cached_prefix(b).empty());
  Sequence c = make_seq(3, iota_tokens(5));
  CHECK(kv.find_cached_prefix(c) == Ids{0});
}

TEST_CASE("check_integrity reports what is inconsistent") {
  KvCacheManager kv(config(4));
  Sequence a = make_seq(1, iota_tokens(8));
  REQUIRE(kv.allocate(a, 8));
  compute_all(kv, a);
  CHECK(integrity(kv, {&a}) == "");
  CHECK(integrity(kv, {}) == "block 0: refcount 1 but 0 tables hold it");
  a.num_computed_tokens = 9;
  CHECK(integrity(kv, {&a}) == "sequence 1: computed tokens beyond its block table");
  a.num_computed_tokens = 8;
  a.tokens[5] = 77;  // the tokens no longer match the cached block
  CHECK(integrity(kv, {&a}) == "sequence 1: block 1 holds other tokens");
}

TEST_CASE("with prefix caching off nothing is cached, matched, counted or published") {
  KvCacheManager kv(config(4, false));
  Sequence a = make_seq(1, iota_tokens(8));
  REQUIRE(kv.allocate(a, 8));
  compute_all(kv, a);
  kv.free(a);
  CHECK(kv.pool().free_list() == Ids{0, 1, 2, 3});  // uncached: each pushed to the front
  Sequence b = make_seq(2, iota_tokens(9));
  CHECK(kv.find_cached_prefix(b).empty());
  CHECK(kv.cache().size() == 0);
  CHECK(kv.events()->last_seq() == 0);
  CHECK(kv.stats().prefix_query_tokens == 0);
  CHECK(integrity(kv, {}) == "");
}

TEST_CASE("a snapshot lists every cached block, parents before children, as of the last event") {
  KvCacheManager kv(config(4));
  Sequence a = make_seq(1, iota_tokens(8));
  REQUIRE(kv.allocate(a, 8));
  compute_all(kv, a);
  kv.free(a);
  Sequence c = make_seq(2, iota_tokens(12, 100));
  REQUIRE(kv.allocate(c, 12));
  REQUIRE(c.block_table == Ids{2, 3, 1});  // the last block reuses a lower id than its parents
  compute_all(kv, c);
  const Hashes ha = block_hashes(kRoot, a.tokens, 4), hc = block_hashes(kRoot, c.tokens, 4);
  const KvSnapshot snap = kv.snapshot();
  CHECK(snap.seq == 3);  // stored a, removed ha[1], stored c
  REQUIRE(snap.blocks.size() == 4);
  CHECK(snap.blocks[0].hash == ha[0]);  // depth 0, block 0
  CHECK(snap.blocks[1].hash == hc[0]);  // depth 0, block 2
  CHECK(snap.blocks[1].parent == kRoot);
  CHECK(snap.blocks[2].hash == hc[1]);  // block 3
  CHECK(snap.blocks[3].hash == hc[2]);  // block 1
  CHECK(snap.blocks[3].parent == hc[1]);
  CHECK(integrity(kv, {&c}) == "");
}

TEST_CASE("a salted chain hashes under its own root but names the namespace root in events and snapshots") {
  KvCacheManager kv(config(8));
  const BlockHash salted = block_hash_root("tiny-llama", "tenant-a");
  Sequence a = make_seq(1, iota_tokens(8));
  a.hash_root = salted;
  REQUIRE(kv.allocate(a, 8));
  compute_all(kv, a);
  const Hashes ha = block_hashes(salted, a.tokens, 4);  // the salt is in every hash
  CHECK(ha != block_hashes(kRoot, a.tokens, 4));
  const KvReplay r = kv.events()->since(0);
  REQUIRE(r.events.size() == 1);
  CHECK(r.events[0].block_hashes == ha);
  CHECK(r.events[0].parent == kRoot);  // a router knows this root; it cannot know the tenant's
  const KvSnapshot snap = kv.snapshot();
  REQUIRE(snap.blocks.size() == 2);
  CHECK(snap.blocks[0].hash == ha[0]);
  CHECK(snap.blocks[0].parent == kRoot);
  CHECK(snap.blocks[1].parent == ha[0]);
}
