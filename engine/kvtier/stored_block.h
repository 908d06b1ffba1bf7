// StoredBlock: one KV block as the tiers below the device pool keep it: its chained hash and parent
// (Contract 1), its tokens (compared on every hit, as the prefix cache does, so a 64-bit collision never
// hands out another prompt's K/V), and its bytes: every layer, layer after layer, each K then V in the
// backend's KV dtype (Backend::read_kv_blocks, the layout of Contract 5). Immutable once made; shared
// between tiers (a block on its way to disk is the same object the host tier holds).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::kvtier {

struct StoredBlock {
  BlockHash hash = 0;
  BlockHash parent = 0;
  std::vector<TokenId> tokens;
  std::vector<std::byte> bytes;

  bool holds(std::span<const TokenId> want) const { return std::ranges::equal(tokens, want); }
  std::size_t footprint() const { return bytes.size() + tokens.size() * sizeof(TokenId) + sizeof(StoredBlock); }
};

using StoredBlockPtr = std::shared_ptr<const StoredBlock>;

}  // namespace kvfleet::kvtier
