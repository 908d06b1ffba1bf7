#include <doctest/doctest.h>

#include <numeric>

#include "kvfleet/block_hash.h"

using namespace kvfleet;

TEST_CASE("block hashes are pinned (Contract 1): router and engine must agree bit for bit") {
  const BlockHash root = block_hash_root("tiny-llama");
  std::vector<TokenId> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 0);
  const auto h = block_hashes(root, tokens, 16);
  REQUIRE(h.size() == 2);  // 40 tokens: two full blocks, the partial third is not hashed
  // These values are the contract: a change here breaks every deployed router/replica pair.
  CHECK(root == 0x39f3c2827d93f1edULL);
  CHECK(h[0] == 0x6ddb490a997f5141ULL);
  CHECK(h[1] == 0x0fca60d811be7217ULL);
  CHECK(block_hash_root("tiny-llama", "tenant-a") != root);
}

TEST_CASE("a block hash depends on its whole prefix") {
  const BlockHash root = block_hash_root("m");
  std::vector<TokenId> a(32, 7), b(32, 7);
  b[3] = 8;  // differs in the first block only
  const auto ha = block_hashes(root, a, 16), hb = block_hashes(root, b, 16);
  CHECK(ha[0] != hb[0]);
  CHECK(ha[1] != hb[1]);  // same tokens in block 1, different parent
  CHECK(block_hashes(root, std::span<const TokenId>(a).first(15), 16).empty());
}
