#include "kvfleet/kv_cache_manager.h"

#include <algorithm>
#include <stdexcept>

namespace kvfleet {

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : block_size_(config.block_size),
      prefix_caching_(config.enable_prefix_caching),
      pool_(config.num_blocks),
      cache_(config.num_blocks, config.block_size, config.root),
      events_(std::make_shared<KvEventRing>(config.event_ring_capacity, config.block_size, config.root)) {}

void KvCacheManager::extend_hashes(Sequence& seq, std::size_t num_blocks) const {
  auto& hashes = seq.block_hashes;
  const auto bs = static_cast<std::size_t>(block_size_);
  const std::span<const TokenId> tokens(seq.tokens);
  while (hashes.size() < num_blocks) {
    const BlockHash parent = hashes.empty() ? root_of(seq) : hashes.back();
    hashes.push_back(block_hash_next(parent, tokens.subspan(hashes.size() * bs, bs)));
  }
}

std::vector<BlockId> KvCacheManager::find_cached_prefix(Sequence& seq) const {
  if (!prefix_caching_ || seq.num_tokens() == 0) return {};
  // At least the last known token is computed, so that its logits exist.
  const auto max_blocks = static_cast<std::size_t>((seq.num_tokens() - 1) / block_size_);
  extend_hashes(seq, max_blocks);
  return cache_.match(seq.block_hashes, seq.tokens, max_blocks);
}

std::int32_t KvCacheManager::num_free_among(std::span<const BlockId> blocks) const {
  return static_cast<std::int32_t>(
      std::count_if(blocks.begin(), blocks.end(), [&](BlockId b) { return pool_.is_free(b); }));
}

bool KvCacheManager::can_allocate(const Sequence& seq, std::int32_t num_new_tokens,
                                  std::span<const BlockId> cached_prefix) const {
  if (!cached_prefix.empty() && !seq.block_table.empty()) {
    throw std::logic_error("KvCacheManager: a cached prefix is only taken by a sequence without blocks");
  }
  const auto prefix = static_cast<std::int32_t>(cached_prefix.size());
  const auto have = static_cast<std::int32_t>(seq.block_table.size()) + prefix;
  const std::int32_t computed = seq.block_table.empty() ? prefix * block_size_ : seq.num_computed_tokens;
  const std::int32_t new_blocks = std::max(0, blocks_for(computed + num_new_tokens) - have);
  // Reviving a free cached block takes it off the free list, so it cannot also serve as a new one.
  return new_blocks <= pool_.num_free() - num_free_among(cached_prefix);
}

bool KvCacheManager::allocate(Sequence& seq, std::int32_t num_new_tokens, std::span<const BlockId> cached_prefix) {
  if (!can_allocate(seq, num_new_tokens, cached_prefix)) return false;
  if (seq.block_table.empty() && seq.num_computed_tokens == 0 && prefix_caching_) {
    prefix_query_tokens_ += static_cast<std::uint64_t>(seq.num_tokens());
    prefix_hit_tokens_ += cached_prefix.size() * static_cast<std::uint64_t>(block_size_);
  }
  // Revive the prefix first: popping new blocks could otherwise evict one of them.
  for (const BlockId b : cached_prefix) {
    pool_.acquire(b);
    seq.block_table.push_back(b);
  }
  if (!cached_prefix.empty()) {
    seq.num_computed_tokens = static_cast<std::int32_t>(cached_prefix.size()) * block_size_;
    seq.num_cached_blocks = static_cast<std::int32_t>(cached_prefix.size());
  }
  const std::int32_t need = blocks_for(seq.num_computed_tokens + num_new_tokens);
  std::vector<BlockHash> evicted;
  while (static_cast<std::int32_t>(seq.block_table.size()) < need) seq.block_table.push_back(take_free_block(evicted));
  if (!evicted.empty()) events_->publish(KvEvent::Type::removed, std::move(evicted));
  return true;
}

BlockId KvCacheManager::take_free_block(std::vector<BlockHash>& evicted) {
  const BlockId b = pool_.pop_free();
  if (hooks_.on_evict && cache_.is_cached(b)) hooks_.on_evict(b, cache_.hash_of(b), cache_.parent_of(b), cache_.tokens_of(b));
  if (const auto hash = cache_.evict(b)) {
    evicted.push_back(*hash);
    ++evicted_blocks_;
  }
  return b;
}

void KvCacheManager::commit(Sequence& seq) {
  if (!prefix_caching_) return;
  const std::int32_t full =
      std::min(seq.num_computed_tokens / block_size_, static_cast<std::int32_t>(seq.block_table.size()));
  if (full <= seq.num_cached_blocks) return;
  extend_hashes(seq, static_cast<std::size_t>(full));
  const auto bs = static_cast<std::size_t>(block_size_);
  const std::span<const TokenId> tokens(seq.tokens);
  std::vector<BlockHash> run;  // consecutive blocks stored by this call: one `stored` event each run
  BlockHash run_parent = 0;
  const auto flush = [&] {
    if (!run.empty()) events_->publish(KvEvent::Type::stored, std::move(run), run_parent);
    run.clear();
  };
  for (auto i = static_cast<std::size_t>(seq.num_cached_blocks); i < static_cast<std::size_t>(full); ++i) {
    const BlockHash parent = i == 0 ? root_of(seq) : seq.block_hashes[i - 1];
    // Fails when another sequence cached the same content first: this block then stays private.
    if (cache_.insert(seq.block_hashes[i], parent, seq.block_table[i], tokens.subspan(i * bs, bs))) {
      if (hooks_.on_commit) hooks_.on_commit(seq.block_table[i], seq.block_hashes[i], parent, tokens.subspan(i * bs, bs));
      // A salted chain's first block names the namespace root in its event, as an unsalted one does: the
      // router places chains under the roots it knows, and the salt is already in every block's hash.
      if (run.empty()) run_parent = i == 0 ? cache_.root() : parent;
      run.push_back(seq.block_hashes[i]);
    } else {
      flush();
    }
  }
  flush();
  seq.num_cached_blocks = full;
}

void KvCacheManager::trim(Sequence& seq) {
  const auto keep = static_cast<std::size_t>(blocks_for(seq.num_tokens()));
  while (seq.block_table.size() > keep) {
    pool_.release(seq.block_table.back(), cache_.is_cached(seq.block_table.back()));
    seq.block_table.pop_back();
  }
}

void KvCacheManager::free(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    pool_.release(*it, cache_.is_cached(*it));
  }
  seq.block_table.clear();
  seq.num_cached_blocks = 0;
}

KvSnapshot KvCacheManager::snapshot() const {
  // Depth of each cached block in its chain of cached ancestors, so parents sort first.
  std::vector<std::int32_t> depth(static_cast<std::size_t>(pool_.num_blocks()), -1);
  std::vector<BlockId> path;
  const std::vector<BlockId> blocks = cache_.cached_blocks();
  for (const BlockId start : blocks) {
    BlockId b = start;
    while (b != kNoBlock && depth[static_cast<std::size_t>(b)] < 0) {  // walk up to a known depth
      path.push_back(b);
      b = cache_.find(cache_.parent_of(b));
    }
    std::int32_t d = b == kNoBlock ? -1 : depth[static_cast<std::size_t>(b)];
    for (auto it = path.rbegin(); it != path.rend(); ++it) depth[static_cast<std::size_t>(*it)] = ++d;
    path.clear();
  }
  std::vector<BlockId> order = blocks;
  std::stable_sort(order.begin(), order.end(), [&](BlockId a, BlockId b) {
    return depth[static_cast<std::size_t>(a)] < depth[static_cast<std::size_t>(b)];
  });
  KvSnapshot snap;
  snap.seq = events_->last_seq();
  snap.blocks.reserve(order.size());
  // A block with no cached ancestor starts a chain: under the namespace root (a salted chain's own root is
  // not one the router knows; see commit()).
  for (const BlockId b : order)
    snap.blocks.push_back({cache_.hash_of(b), depth[static_cast<std::size_t>(b)] == 0 ? cache_.root() : cache_.parent_of(b)});
  return snap;
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats s;
  s.num_blocks = pool_.num_blocks();
  s.num_free_blocks = pool_.num_free();
  s.num_cached_blocks = static_cast<std::int32_t>(cache_.size());
  s.usage = 1.0 - static_cast<double>(s.num_free_blocks) / static_cast<double>(s.num_blocks);
  s.prefix_query_tokens = prefix_query_tokens_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.evicted_blocks = evicted_blocks_;
  return s;
}

}  // namespace kvfleet
