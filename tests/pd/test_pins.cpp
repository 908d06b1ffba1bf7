// KvCacheManager's pins and block import (engine/kv/kv_pins.cpp), what KV transfer stands on: pinned
// blocks are never handed out or evicted, unpinning frees them tail first into the LRU, imported blocks
// are prefix-cache entries that later sequences hit and that publish `stored`, and the integrity check
// counts pins like block tables.
#include <doctest/doctest.h>

#include "kv/kv_test_util.h"
#include "kvfleet/kv_cache_manager.h"

using namespace kvfleet;
using test::iota_tokens;
using test::make_seq;

namespace {

KvCacheConfig config(int blocks) {
  KvCacheConfig c;
  c.num_blocks = blocks;
  c.block_size = 4;
  c.root = block_hash_root("m");
  return c;
}

}  // namespace

TEST_CASE("a pinned block survives its sequence and cannot be evicted; unpin frees it, cached, at the LRU tail") {
  KvCacheManager kv(config(4));
  Sequence a = make_seq(1, iota_tokens(8));
  REQUIRE(kv.allocate(a, 8));
  a.num_computed_tokens = 8;
  kv.commit(a);
  const std::vector<BlockId> held = a.block_table;
  const auto pin = kv.pin(held);
  kv.free(a);
  const Sequence* none[] = {nullptr};
  CHECK(kv.check_integrity(std::span<const Sequence* const>(none, 0)).empty());
  CHECK(kv.pool().num_free() == 2);
  Sequence b = make_seq(2, iota_tokens(12, 100));
  CHECK_FALSE(kv.allocate(b, 12));  // 3 blocks wanted, 2 free: the pinned ones are not for taking
  CHECK(kv.pinned_blocks(pin).size() == 2);
  CHECK(kv.unpin(pin));
  CHECK_FALSE(kv.unpin(pin));
  CHECK(kv.num_pins() == 0);
  CHECK(kv.pool().num_free() == 4);
  const auto free = kv.pool().free_list();
  CHECK(free[2] == held[1]);  // tail first: the prompt's last block is evicted before its first
  CHECK(free[3] == held[0]);
  CHECK(kv.check_integrity(std::span<const Sequence* const>(none, 0)).empty());
}

TEST_CASE("imported blocks are cache entries that a later sequence hits, announced as stored") {
  KvCacheManager kv(config(4));
  const auto tokens = iota_tokens(9, 50);
  const auto hashes = block_hashes(kv.cache().root(), tokens, 4);
  const auto pin = kv.pin({});
  const auto seq0 = kv.events()->last_seq();
  const BlockId b0 = kv.import_block(pin, hashes[0], kv.cache().root(), std::span(tokens).first(4));
  const BlockId b1 = kv.import_block(pin, hashes[1], hashes[0], std::span(tokens).subspan(4, 4));
  REQUIRE(b0 != kNoBlock);
  REQUIRE(b1 != kNoBlock);
  CHECK(kv.import_block(pin, hashes[1], hashes[0], std::span(tokens).subspan(4, 4)) == kNoBlock);  // cached already
  CHECK(kv.cached_block(hashes[1], std::span(tokens).subspan(4, 4)) == b1);
  CHECK(kv.cached_block(hashes[1], std::span(tokens).subspan(0, 4)) == kNoBlock);  // other tokens: a collision
  const auto replay = kv.events()->since(seq0);
  REQUIRE(replay.events.size() == 2);
  CHECK(replay.events[1].type == KvEvent::Type::stored);
  CHECK(replay.events[1].block_hashes == std::vector<BlockHash>{hashes[1]});
  CHECK(replay.events[1].parent == hashes[0]);

  Sequence s = make_seq(1, tokens);
  const auto prefix = kv.find_cached_prefix(s);
  CHECK(prefix == std::vector<BlockId>{b0, b1});
  REQUIRE(kv.allocate(s, 1, prefix));
  CHECK(s.num_computed_tokens == 8);
  const Sequence* live[] = {&s};
  CHECK(kv.check_integrity(live).empty());
  kv.unpin(pin);
  CHECK(kv.check_integrity(live).empty());
  kv.free(s);
  CHECK(kv.pool().num_free() == 4);
}

TEST_CASE("import with no free block, or with prefix caching off, changes nothing") {
  KvCacheManager kv(config(1));
  Sequence a = make_seq(1, iota_tokens(3));
  REQUIRE(kv.allocate(a, 3));
  const auto pin = kv.pin({});
  const auto tokens = iota_tokens(4, 9);
  CHECK(kv.import_block(pin, 77, kv.cache().root(), tokens) == kNoBlock);
  CHECK(kv.cache().size() == 0);
  CHECK(kv.import_block(pin + 1, 77, kv.cache().root(), tokens) == kNoBlock);  // unknown pin
  KvCacheConfig off = config(2);
  off.enable_prefix_caching = false;
  KvCacheManager plain(off);
  const auto p2 = plain.pin({});
  CHECK(plain.import_block(p2, 77, plain.cache().root(), tokens) == kNoBlock);
}

TEST_CASE("landing blocks: reserved with no cache entry, entered once verified; unentered ones go back uncached") {
  KvCacheManager kv(config(4));
  const Sequence* none[] = {nullptr};
  const auto no_seqs = std::span<const Sequence* const>(none, 0);
  const auto tokens = iota_tokens(8, 70);
  const auto hashes = block_hashes(kv.cache().root(), tokens, 4);
  const auto landing = kv.pin({}), request = kv.pin({});
  const auto seq0 = kv.events()->last_seq();
  const BlockId b0 = kv.reserve_block(landing), b1 = kv.reserve_block(landing);
  REQUIRE(b0 != kNoBlock);
  REQUIRE(b1 != kNoBlock);
  CHECK(kv.pool().num_free() == 2);
  CHECK(kv.cache().size() == 0);  // nothing can find a block whose bytes are still arriving
  CHECK(kv.events()->since(seq0).events.empty());
  CHECK(kv.check_integrity(no_seqs).empty());
  // b0 verified: entered and moved under the request's pin; b1 failed its checksum: never entered.
  CHECK(kv.enter_block(b0, hashes[0], kv.cache().root(), std::span(tokens).first(4)));
  CHECK(kv.add_to_pin(request, b0));
  CHECK(kv.cached_block(hashes[0], std::span(tokens).first(4)) == b0);
  CHECK_FALSE(kv.enter_block(b1, hashes[0], kv.cache().root(), std::span(tokens).first(4)));  // hash cached already
  CHECK_FALSE(kv.enter_block(b0, hashes[1], hashes[0], std::span(tokens).subspan(4, 4)));   // b0 is cached
  const auto replay = kv.events()->since(seq0);
  REQUIRE(replay.events.size() == 1);
  CHECK(replay.events[0].type == KvEvent::Type::stored);
  CHECK(replay.events[0].block_hashes == std::vector<BlockHash>{hashes[0]});
  CHECK(kv.unpin(landing));
  CHECK(kv.pool().num_free() == 3);  // b1 is free again; b0 lives on in the request's pin
  CHECK(kv.cache().size() == 1);
  CHECK(kv.cached_block(hashes[1], std::span(tokens).subspan(4, 4)) == kNoBlock);
  CHECK_FALSE(kv.enter_block(b1, hashes[1], hashes[0], std::span(tokens).subspan(4, 4)));  // b1 is unreferenced
  CHECK(kv.check_integrity(no_seqs).empty());
  CHECK(kv.unpin(request));
  CHECK(kv.pool().num_free() == 4);
  CHECK(kv.check_integrity(no_seqs).empty());
  // No free block, an unknown pin, or prefix caching off: nothing is reserved.
  const auto full = kv.pin({});
  for (int i = 0; i < 4; ++i) CHECK(kv.reserve_block(full) != kNoBlock);
  CHECK(kv.reserve_block(full) == kNoBlock);
  CHECK(kv.reserve_block(full + 100) == kNoBlock);
  KvCacheConfig off = config(2);
  off.enable_prefix_caching = false;
  KvCacheManager plain(off);
  CHECK(plain.reserve_block(plain.pin({})) == kNoBlock);
}
