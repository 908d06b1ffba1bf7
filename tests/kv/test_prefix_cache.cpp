#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "kv_test_util.h"
#include "kvfleet/prefix_cache.h"

using namespace kvfleet;
using kvfleet::test::iota_tokens;
using Ids = std::vector<BlockId>;
using Tokens = std::vector<TokenId>;

namespace {
constexpr std::int32_t kB = 4;

std::span<const TokenId> block(const Tokens& t, std::size_t i) { return std::span(t).subspan(i * kB, kB); }
}  // namespace

TEST_CASE("match finds the longest cached run of full blocks and changes nothing") {
  const BlockHash root = block_hash_root("m");
  PrefixCache cache(8, kB, root);
  const Tokens t = iota_tokens(12);
  const auto h = block_hashes(root, t, kB);
  REQUIRE(cache.insert(h[0], root, 7, block(t, 0)));
  REQUIRE(cache.insert(h[1], h[0], 3, block(t, 1)));

  CHECK(cache.match(t) == Ids{7, 3});
  CHECK(cache.match(std::span(t).first(7)) == Ids{7});  // the second block is partial: not matched
  CHECK(cache.match(h, t, 1) == Ids{7});
  CHECK(cache.match(iota_tokens(12, 1)).empty());
  CHECK(cache.size() == 2);
  CHECK(cache.parent_of(3) == h[0]);
  CHECK(cache.parent_of(7) == root);
  CHECK(cache.check_integrity().empty());
}

TEST_CASE("a block's hash depends on the namespace root") {
  PrefixCache cache(4, kB, block_hash_root("a"));
  const Tokens t = iota_tokens(4);
  REQUIRE(cache.insert(block_hashes(block_hash_root("a"), t, kB)[0], 0, 0, t));
  CHECK(cache.match(t) == Ids{0});
  PrefixCache other(4, kB, block_hash_root("b"));
  REQUIRE(other.insert(block_hashes(block_hash_root("a"), t, kB)[0], 0, 0, t));
  CHECK(other.match(t).empty());
}

TEST_CASE("collision guard: a hash hit with other tokens is a miss") {
  const BlockHash root = block_hash_root("m");
  PrefixCache cache(8, kB, root);
  const Tokens real = iota_tokens(8);
  const Tokens forged = iota_tokens(4, 100);
  const auto h = block_hashes(root, real, kB);
  // Forge a collision: block 5 claims the hash of `real`'s first block but holds other tokens.
  REQUIRE(cache.insert(h[0], root, 5, forged));
  CHECK(cache.find(h[0]) == 5);
  CHECK(cache.match(real).empty());
  CHECK(cache.match(h, real, 2).empty());
}

TEST_CASE("insert refuses a known hash or an already cached block; evict drops the entry") {
  const BlockHash root = block_hash_root("m");
  PrefixCache cache(4, kB, root);
  const Tokens t = iota_tokens(8);
  const auto h = block_hashes(root, t, kB);
  CHECK(cache.insert(h[0], root, 0, block(t, 0)));
  CHECK_FALSE(cache.insert(h[0], root, 1, block(t, 0)));  // someone computed the same block first
  CHECK_FALSE(cache.insert(h[1], h[0], 0, block(t, 1)));  // block 0 already holds an entry
  CHECK_FALSE(cache.is_cached(1));
  CHECK(cache.insert(h[1], h[0], 1, block(t, 1)));
  CHECK(cache.cached_blocks() == Ids{0, 1});

  CHECK(cache.evict(1) == h[1]);
  CHECK(cache.evict(1) == std::nullopt);
  CHECK(cache.match(t) == Ids{0});
  cache.clear();
  CHECK(cache.size() == 0);
  CHECK(cache.match(t).empty());
  CHECK_THROWS_AS(cache.insert(h[0], root, 2, std::span(t).first(3)), std::invalid_argument);
  CHECK(cache.check_integrity().empty());
}
