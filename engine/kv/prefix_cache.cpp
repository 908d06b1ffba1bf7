#include "kvfleet/prefix_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvfleet {

PrefixCache::PrefixCache(std::int32_t num_blocks, std::int32_t block_size, BlockHash root)
    : root_(root), block_size_(block_size) {
  if (num_blocks <= 0 || block_size <= 0) throw std::invalid_argument("PrefixCache: bad sizes");
  const auto n = static_cast<std::size_t>(num_blocks);
  hash_.assign(n, 0);
  parent_.assign(n, 0);
  cached_.assign(n, 0);
  tokens_.assign(n * static_cast<std::size_t>(block_size), 0);
  map_.reserve(n);
}

std::vector<BlockId> PrefixCache::match(std::span<const TokenId> tokens) const {
  const auto hashes = block_hashes(root_, tokens, static_cast<std::size_t>(block_size_));
  return match(hashes, tokens, hashes.size());
}

std::vector<BlockId> PrefixCache::match(std::span<const BlockHash> hashes, std::span<const TokenId> tokens,
                                        std::size_t max_blocks) const {
  std::vector<BlockId> out;
  const auto bs = static_cast<std::size_t>(block_size_);
  const std::size_t limit = std::min({max_blocks, hashes.size(), tokens.size() / bs});
  for (std::size_t i = 0; i < limit; ++i) {
    const BlockId b = find(hashes[i]);
    if (b == kNoBlock) break;
    const auto want = tokens.subspan(i * bs, bs);
    if (!std::equal(want.begin(), want.end(), tokens_of(b).begin())) break;  // a collision
    out.push_back(b);
  }
  return out;
}

bool PrefixCache::insert(BlockHash hash, BlockHash parent, BlockId block, std::span<const TokenId> tokens) {
  if (tokens.size() != static_cast<std::size_t>(block_size_)) {
    throw std::invalid_argument("PrefixCache::insert: only full blocks are cached");
  }
  if (cached_[block] || map_.contains(hash)) return false;
  map_.emplace(hash, block);
  hash_[block] = hash;
  parent_[block] = parent;
  cached_[block] = 1;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(block) * block_size_);
  return true;
}

std::optional<BlockHash> PrefixCache::evict(BlockId block) {
  if (!cached_[block]) return std::nullopt;
  cached_[block] = 0;
  map_.erase(hash_[block]);
  return hash_[block];
}

void PrefixCache::clear() {
  map_.clear();
  std::fill(cached_.begin(), cached_.end(), 0);
}

std::span<const TokenId> PrefixCache::tokens_of(BlockId block) const {
  return std::span<const TokenId>(tokens_).subspan(static_cast<std::size_t>(block) * block_size_,
                                                   static_cast<std::size_t>(block_size_));
}

BlockId PrefixCache::find(BlockHash hash) const {
  const auto it = map_.find(hash);
  return it == map_.end() ? kNoBlock : it->second;
}

std::vector<BlockId> PrefixCache::cached_blocks() const {
  std::vector<BlockId> out;
  out.reserve(map_.size());
  for (BlockId b = 0; b < static_cast<BlockId>(cached_.size()); ++b) {
    if (cached_[b]) out.push_back(b);
  }
  return out;
}

std::string PrefixCache::check_integrity() const {
  std::size_t cached = 0;
  for (BlockId b = 0; b < static_cast<BlockId>(cached_.size()); ++b) {
    if (!cached_[b]) continue;
    ++cached;
    if (find(hash_[b]) != b) return "block " + std::to_string(b) + " is cached but its hash maps elsewhere";
  }
  if (cached != map_.size()) return "hash map holds entries for blocks that are not marked cached";
  return {};
}

}  // namespace kvfleet
