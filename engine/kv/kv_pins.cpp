// KvCacheManager's pins and block import, for KV transfer between replicas (Contract 3, engine/pd).
// A pin is a list of block references that no sequence owns; check_integrity() counts them like tables.
#include <algorithm>

#include "kvfleet/kv_cache_manager.h"

namespace kvfleet {

KvCacheManager::PinId KvCacheManager::pin(std::span<const BlockId> blocks) {
  const PinId id = next_pin_++;
  auto& held = pins_[id];
  for (const BlockId b : blocks) {
    pool_.acquire(b);
    held.push_back(b);
  }
  return id;
}

bool KvCacheManager::add_to_pin(PinId id, BlockId block) {
  const auto it = pins_.find(id);
  if (it == pins_.end()) return false;
  pool_.acquire(block);
  it->second.push_back(block);
  return true;
}

bool KvCacheManager::unpin(PinId id) {
  const auto it = pins_.find(id);
  if (it == pins_.end()) return false;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) pool_.release(*b, cache_.is_cached(*b));
  pins_.erase(it);
  return true;
}

std::span<const BlockId> KvCacheManager::pinned_blocks(PinId id) const {
  const auto it = pins_.find(id);
  return it == pins_.end() ? std::span<const BlockId>{} : std::span<const BlockId>(it->second);
}

BlockId KvCacheManager::cached_block(BlockHash hash, std::span<const TokenId> tokens) const {
  const BlockId b = cache_.find(hash);
  if (b == kNoBlock) return kNoBlock;
  const auto have = cache_.tokens_of(b);
  return std::equal(tokens.begin(), tokens.end(), have.begin(), have.end()) ? b : kNoBlock;
}

BlockId KvCacheManager::import_block(PinId id, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens) {
  if (!prefix_caching_ || !pins_.contains(id) || pool_.num_free() == 0 || cache_.find(hash) != kNoBlock) {
    return kNoBlock;
  }
  std::vector<BlockHash> evicted;
  const BlockId b = take_free_block(evicted);  // one reference, now the pin's
  if (!evicted.empty()) events_->publish(KvEvent::Type::removed, std::move(evicted));
  cache_.insert(hash, parent, b, tokens);
  events_->publish(KvEvent::Type::stored, std::vector<BlockHash>{hash}, parent);
  pins_[id].push_back(b);
  return b;
}

BlockId KvCacheManager::reserve_block(PinId id) {
  if (!prefix_caching_ || !pins_.contains(id) || pool_.num_free() == 0) return kNoBlock;
  std::vector<BlockHash> evicted;
  const BlockId b = take_free_block(evicted);  // one reference, now the pin's; no cache entry
  if (!evicted.empty()) events_->publish(KvEvent::Type::removed, std::move(evicted));
  pins_[id].push_back(b);
  return b;
}

bool KvCacheManager::enter_block(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens) {
  if (!prefix_caching_ || cache_.find(hash) != kNoBlock || cache_.is_cached(block) || pool_.is_free(block)) return false;
  cache_.insert(hash, parent, block, tokens);
  events_->publish(KvEvent::Type::stored, std::vector<BlockHash>{hash}, parent);
  return true;
}

}  // namespace kvfleet
