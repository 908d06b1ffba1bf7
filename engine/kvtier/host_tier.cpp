#include "engine/kvtier/host_tier.h"

namespace kvfleet::kvtier {

StoredBlockPtr HostTier::find(BlockHash hash, std::span<const TokenId> tokens) {
  const auto it = index_.find(hash);
  if (it == index_.end() || !(*it->second)->holds(tokens)) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return *it->second;
}

bool HostTier::insert(StoredBlockPtr block, std::vector<BlockHash>& dropped) {
  const std::uint64_t size = block->footprint();
  if (size > max_bytes_) return false;
  if (const auto it = index_.find(block->hash); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return true;
  }
  while (bytes_ + size > max_bytes_) {
    const StoredBlockPtr& victim = lru_.back();
    bytes_ -= victim->footprint();
    dropped.push_back(victim->hash);
    index_.erase(victim->hash);
    lru_.pop_back();
  }
  lru_.push_front(std::move(block));
  index_.emplace(lru_.front()->hash, lru_.begin());
  bytes_ += size;
  return true;
}

std::vector<BlockHash> HostTier::lru_order() const {
  std::vector<BlockHash> out;
  out.reserve(lru_.size());
  for (const auto& b : lru_) out.push_back(b->hash);
  return out;
}

std::vector<std::pair<BlockHash, BlockHash>> HostTier::held() const {
  std::vector<std::pair<BlockHash, BlockHash>> out;
  out.reserve(lru_.size());
  for (const auto& b : lru_) out.emplace_back(b->hash, b->parent);
  return out;
}

}  // namespace kvfleet::kvtier
