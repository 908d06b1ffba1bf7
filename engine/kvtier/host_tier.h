// HostTier: KV blocks in host RAM beyond the device pool, keyed by block hash, bounded in bytes, evicted
// least recently used first. The engine thread alone uses it (no lock).
//
// A block enters when the device pool evicts it (KvTiers decides; see kv_tiers.h) and stays when it is
// copied back up: the host copy is still valid (the content is addressed by its hash), so a block that
// bounces between the pool and the host is copied down only once. find() marks a block used.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "engine/kvtier/stored_block.h"

namespace kvfleet::kvtier {

class HostTier {
 public:
  explicit HostTier(std::uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // The block stored under `hash`, holding exactly `tokens`; null on a miss. A hit becomes the most recent.
  StoredBlockPtr find(BlockHash hash, std::span<const TokenId> tokens);
  bool contains(BlockHash hash) const { return index_.contains(hash); }
  // Stores `block` as the most recent, dropping least recently used blocks until it fits; appends their
  // hashes to `dropped`. A block larger than the whole bound is not stored (false).
  bool insert(StoredBlockPtr block, std::vector<BlockHash>& dropped);

  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t max_bytes() const { return max_bytes_; }
  std::size_t size() const { return index_.size(); }
  // Most recent first (tests).
  std::vector<BlockHash> lru_order() const;
  // Every block held, as (hash, parent), most recent first (a KV event snapshot).
  std::vector<std::pair<BlockHash, BlockHash>> held() const;

 private:
  const std::uint64_t max_bytes_;
  std::uint64_t bytes_ = 0;
  std::list<StoredBlockPtr> lru_;  // front: most recent
  std::unordered_map<BlockHash, std::list<StoredBlockPtr>::iterator> index_;
};

}  // namespace kvfleet::kvtier
