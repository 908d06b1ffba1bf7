// HostTier: byte bound, LRU order, the token guard.
#include <doctest/doctest.h>

#include "engine/kvtier/host_tier.h"

using namespace kvfleet;
using namespace kvfleet::kvtier;

namespace {

StoredBlockPtr block(BlockHash hash, TokenId token, std::size_t bytes = 100) {
  auto b = std::make_shared<StoredBlock>();
  b->hash = hash;
  b->tokens = {token, token};
  b->bytes = BlockBytes::allocate(bytes);
  return b;
}

}  // namespace

TEST_CASE("the host tier keeps the most recently used blocks within its byte bound") {
  const std::size_t one = block(1, 0)->footprint();
  HostTier host(3 * one);
  std::vector<BlockHash> dropped;
  CHECK(host.insert(block(1, 1), dropped));
  CHECK(host.insert(block(2, 2), dropped));
  CHECK(host.insert(block(3, 3), dropped));
  CHECK(dropped.empty());
  CHECK(host.bytes() == 3 * one);
  CHECK(host.find(1, std::vector<TokenId>{1, 1}) != nullptr);  // 1 becomes the most recent
  CHECK(host.lru_order() == std::vector<BlockHash>{1, 3, 2});
  CHECK(host.insert(block(4, 4), dropped));
  CHECK(dropped == std::vector<BlockHash>{2});  // the least recently used goes
  CHECK(host.lru_order() == std::vector<BlockHash>{4, 1, 3});
  CHECK(host.size() == 3);
  CHECK(host.bytes() == 3 * one);
}

TEST_CASE("a host hit needs the same tokens, and a block larger than the bound is not kept") {
  HostTier host(1000);
  std::vector<BlockHash> dropped;
  CHECK(host.insert(block(7, 5), dropped));
  CHECK(host.find(7, std::vector<TokenId>{5, 5}) != nullptr);
  CHECK(host.find(7, std::vector<TokenId>{5, 6}) == nullptr);  // a hash collision is a miss
  CHECK(host.find(8, std::vector<TokenId>{5, 5}) == nullptr);
  CHECK_FALSE(host.insert(block(9, 1, 2000), dropped));
  CHECK(host.size() == 1);
  CHECK(dropped.empty());
}

TEST_CASE("storing a block the host tier holds already only marks it used") {
  const std::size_t one = block(1, 0)->footprint();
  HostTier host(2 * one);
  std::vector<BlockHash> dropped;
  host.insert(block(1, 1), dropped);
  host.insert(block(2, 2), dropped);
  host.insert(block(1, 1), dropped);
  CHECK(host.lru_order() == std::vector<BlockHash>{1, 2});
  CHECK(host.bytes() == 2 * one);
  CHECK(dropped.empty());
}
