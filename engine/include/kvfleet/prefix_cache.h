// PrefixCache: block hash (Contract 1) -> the block that holds those tokens' K/V. Full blocks only.
//
// Lookups are read-only (`match` changes nothing); mutation is explicit (`insert`, `evict`,
// `clear`). Every entry keeps a copy of its block's tokens, and a hit counts only when the tokens
// are equal too, so a 64-bit hash collision can never hand a request someone else's K/V.
// Reference counts and LRU order live in BlockPool; the KvCacheManager keeps the two in step.
// Engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvfleet/block_hash.h"
#include "kvfleet/block_pool.h"

namespace kvfleet {

class PrefixCache {
 public:
  PrefixCache(std::int32_t num_blocks, std::int32_t block_size, BlockHash root);

  BlockHash root() const { return root_; }
  std::int32_t block_size() const { return block_size_; }
  std::size_t size() const { return map_.size(); }

  // The longest run of leading full blocks of `tokens` that the cache holds, as block ids.
  std::vector<BlockId> match(std::span<const TokenId> tokens) const;
  // Same, with the blocks' hashes already computed (hashes[i] covers tokens[i*B, i*B+B)); looks at
  // no more than `max_blocks` blocks.
  std::vector<BlockId> match(std::span<const BlockHash> hashes, std::span<const TokenId> tokens,
                             std::size_t max_blocks) const;

  // Maps `hash` to `block`, whose K/V hold `tokens` (block_size of them); `parent` is the previous
  // block's hash (the root for a first block), kept for event snapshots. Returns false and changes
  // nothing when the hash is already mapped (another sequence computed the same block first) or
  // the block already holds an entry.
  bool insert(BlockHash hash, BlockHash parent, BlockId block, std::span<const TokenId> tokens);
  // Drops the block's entry; returns its hash, or nothing when the block held none.
  std::optional<BlockHash> evict(BlockId block);
  void clear();

  bool is_cached(BlockId block) const { return cached_[block] != 0; }
  BlockHash hash_of(BlockId block) const { return hash_[block]; }
  BlockHash parent_of(BlockId block) const { return parent_[block]; }
  std::span<const TokenId> tokens_of(BlockId block) const;
  // The block mapped to `hash`, or kNoBlock.
  BlockId find(BlockHash hash) const;

  // Every cached block, in block id order (for a full snapshot after a `cleared` event).
  std::vector<BlockId> cached_blocks() const;
  // Empty when the map and the per-block metadata agree; otherwise what is wrong.
  std::string check_integrity() const;

 private:
  BlockHash root_;
  std::int32_t block_size_;
  std::unordered_map<BlockHash, BlockId> map_;
  std::vector<BlockHash> hash_;    // per block, valid when cached_
  std::vector<BlockHash> parent_;  // per block, valid when cached_
  std::vector<std::uint8_t> cached_;
  std::vector<TokenId> tokens_;  // num_blocks * block_size: the collision guard
};

}  // namespace kvfleet
