// KvCacheManager::check_integrity: the cross-checks between BlockPool, PrefixCache and the live
// sequences' block tables that tests run after every step.
#include <algorithm>
#include <string>

#include "kvfleet/kv_cache_manager.h"

namespace kvfleet {
namespace {

std::string block_str(BlockId b) { return "block " + std::to_string(b); }

// Free blocks without cached content must all sit before the cached ones (they go first).
std::string check_free_order(const BlockPool& pool, const PrefixCache& cache) {
  bool seen_cached = false;
  for (const BlockId b : pool.free_list()) {
    if (cache.is_cached(b)) {
      seen_cached = true;
    } else if (seen_cached) {
      return "free uncached " + block_str(b) + " sits behind cached free blocks";
    }
  }
  return {};
}

std::string check_sequence(const Sequence& seq, const PrefixCache& cache, std::int32_t block_size) {
  const std::string who = "sequence " + std::to_string(seq.id) + ": ";
  const auto table = static_cast<std::int32_t>(seq.block_table.size());
  if (table * block_size < seq.num_computed_tokens) return who + "computed tokens beyond its block table";
  // Between steps no block lies wholly past the known tokens (a rejected draft's block is freed).
  if (static_cast<std::int64_t>(table - 1) * block_size >= std::max<std::int64_t>(seq.num_tokens(), 1) && table > 0)
    return who + "holds a block past its tokens";
  if (seq.num_cached_blocks > table) return who + "more cached blocks than blocks";
  const auto bs = static_cast<std::size_t>(block_size);
  for (std::int32_t i = 0; i < seq.num_cached_blocks; ++i) {
    const BlockId b = seq.block_table[static_cast<std::size_t>(i)];
    if (!cache.is_cached(b)) continue;  // private duplicate, or the cache was reset
    if (static_cast<std::size_t>(i) >= seq.block_hashes.size() ||
        cache.hash_of(b) != seq.block_hashes[static_cast<std::size_t>(i)]) {
      return who + block_str(b) + " is cached under another hash";
    }
    const auto want = std::span<const TokenId>(seq.tokens).subspan(static_cast<std::size_t>(i) * bs, bs);
    const auto have = cache.tokens_of(b);
    if (!std::equal(want.begin(), want.end(), have.begin())) return who + block_str(b) + " holds other tokens";
  }
  return {};
}

}  // namespace

std::string KvCacheManager::check_integrity(std::span<const Sequence* const> live) const {
  if (auto e = pool_.check_integrity(); !e.empty()) return "pool: " + e;
  if (auto e = cache_.check_integrity(); !e.empty()) return "cache: " + e;
  if (!prefix_caching_ && cache_.size() != 0) return "prefix caching is off but the cache holds blocks";
  if (auto e = check_free_order(pool_, cache_); !e.empty()) return e;

  std::vector<std::int32_t> refs(static_cast<std::size_t>(pool_.num_blocks()), 0);
  for (const Sequence* seq : live) {
    for (const BlockId b : seq->block_table) {
      if (b < 0 || b >= pool_.num_blocks()) return "sequence " + std::to_string(seq->id) + " holds an invalid block";
      ++refs[static_cast<std::size_t>(b)];
    }
    if (auto e = check_sequence(*seq, cache_, block_size_); !e.empty()) return e;
  }
  for (const auto& [id, blocks] : pins_) {  // pinned references (engine/pd) count as tables
    for (const BlockId b : blocks) {
      if (b < 0 || b >= pool_.num_blocks()) return "pin " + std::to_string(id) + " holds an invalid block";
      ++refs[static_cast<std::size_t>(b)];
    }
  }
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    const std::int32_t want = refs[static_cast<std::size_t>(b)];
    if (pool_.ref_count(b) != want) {
      return block_str(b) + ": refcount " + std::to_string(pool_.ref_count(b)) + " but " + std::to_string(want) +
             " tables hold it";
    }
  }
  return {};
}

}  // namespace kvfleet
