// KvCacheManager: the paged KV cache's bookkeeping for sequences (no device memory here; the model
// runner owns the K/V storage and reads it through the block tables this class fills in).
//
// Life of a sequence's blocks:
//   find_cached_prefix(seq)      read-only: the leading full blocks the prefix cache already holds,
//                                never the whole known sequence (its last token must be computed so
//                                that logits exist)
//   allocate(seq, n, prefix)     takes those blocks (reviving free ones) and new blocks for the next
//                                n tokens, evicting the LRU cached blocks when short; all or nothing
//   commit(seq)                  after a step computed K/V: full blocks enter the prefix cache
//   free(seq)                    on finish, abort or preemption: blocks released tail first
// Every change to the prefix cache is published to the event ring (Contract 2).
// Engine thread only, except events(), whose ring is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvfleet/block_pool.h"
#include "kvfleet/kv_events.h"
#include "kvfleet/prefix_cache.h"
#include "kvfleet/sequence.h"

namespace kvfleet {

struct KvCacheConfig {
  std::int32_t num_blocks = 0;
  std::int32_t block_size = 16;
  BlockHash root = 0;  // block_hash_root(model name, salt): Contract 1
  bool enable_prefix_caching = true;
  std::size_t event_ring_capacity = 4096;
};

// Lets a lower tier (engine/kvtier) see a block's content before it goes: on_evict runs when a cached block is
// about to be reused for other content (its K/V still intact), on_commit when commit() entered a computed block
// in the prefix cache. Both on the engine thread, inside the call that causes them; neither may call back into
// the manager.
struct KvBlockHooks {
  using Hook = std::function<void(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens)>;
  Hook on_evict;
  Hook on_commit;
};

struct KvCacheStats {
  std::int32_t num_blocks = 0;
  std::int32_t num_free_blocks = 0;       // free, cached or not: all can be handed out
  std::int32_t num_cached_blocks = 0;     // blocks the prefix cache maps, free or in use
  double usage = 0.0;                     // 1 - free / total
  std::uint64_t prefix_query_tokens = 0;  // tokens of admitted sequences looked up
  std::uint64_t prefix_hit_tokens = 0;    // of those, found in the cache
  std::uint64_t evicted_blocks = 0;       // cached blocks reused for other content
};

// Everything the prefix cache holds, as of event `seq`: what a router that fell behind the event
// ring gets after a `cleared` event, before the live events from seq + 1 on.
struct KvSnapshot {
  std::uint64_t seq = 0;
  struct Entry {
    BlockHash hash;
    BlockHash parent;  // the root for a first block; 0 for a file tier's block (its parent is not kept)
    KvMedium medium = KvMedium::device;  // a KV tier's block (engine/kvtier) after the prefix cache's
  };
  std::vector<Entry> blocks;  // a parent that is cached comes before its children
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  std::int32_t block_size() const { return block_size_; }
  std::int32_t blocks_for(std::int32_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // The prefix cache's blocks for the leading full blocks of seq.tokens, at most
  // (num_tokens - 1) / block_size of them. Changes no cache state (it extends seq's hash memo).
  std::vector<BlockId> find_cached_prefix(Sequence& seq) const;

  // Makes seq's block table cover num_computed + num_new_tokens positions. For a sequence without
  // blocks, `cached_prefix` (from find_cached_prefix) is taken first and num_computed_tokens set to
  // its length in tokens. Returns false and changes nothing when too few blocks are free.
  bool allocate(Sequence& seq, std::int32_t num_new_tokens, std::span<const BlockId> cached_prefix = {});
  // Whether allocate(seq, num_new_tokens, cached_prefix) would succeed.
  bool can_allocate(const Sequence& seq, std::int32_t num_new_tokens,
                    std::span<const BlockId> cached_prefix = {}) const;

  // Puts seq's full, computed blocks into the prefix cache (call after num_computed_tokens grew).
  void commit(Sequence& seq);
  // Releases seq's blocks, last block first, and empties its table.
  void free(Sequence& seq);
  // Releases the blocks wholly past seq's known tokens, last first (speculative decoding: the blocks that
  // only rejected drafts reached). They hold no committed block: commit() takes computed tokens only.
  void trim(Sequence& seq);

  // Pins (Contract 3, engine/pd; kv_pins.cpp): references held outside any sequence, so that the blocks
  // can neither be freed nor overwritten: a prefill replica's blocks while a decode replica fetches them, a
  // decode replica's imported prefix until the request that reuses it is done. Pin ids start at 1.
  using PinId = std::uint64_t;
  PinId pin(std::span<const BlockId> blocks);  // one more reference on each (an empty pin is allowed)
  // Adds one reference on `block` to an existing pin; false for an unknown pin.
  bool add_to_pin(PinId id, BlockId block);
  // Releases the pin's references, last block first (like free()); false for an unknown pin.
  bool unpin(PinId id);
  std::span<const BlockId> pinned_blocks(PinId id) const;  // empty for an unknown pin
  std::size_t num_pins() const { return pins_.size(); }
  // Imports a block computed elsewhere (a decode replica receiving it from a prefill replica): takes a
  // free block (evicting the least recently used cached one), enters it in the prefix cache under `hash`
  // with `parent` (publishes `stored`) and adds it to pin `id`. The caller writes its K/V before the next
  // step. Returns kNoBlock, changing nothing, when no block is free or `hash` is cached already (then
  // cached_block() finds it).
  BlockId import_block(PinId id, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens);
  // The block cached under `hash` holding exactly `tokens`, or kNoBlock.
  BlockId cached_block(BlockHash hash, std::span<const TokenId> tokens) const;
  // A decode replica's landing block (its KV is read from the network straight into the block's memory,
  // before it is checked): a free block taken into pin `id` (evicting the cached one it held) with NO
  // prefix-cache entry, so nothing can find or read it; unpinned, it goes back to the free list uncached.
  // kNoBlock, changing nothing, when no block is free, prefix caching is off or the pin is unknown.
  BlockId reserve_block(PinId id);
  // Enters a reserved block, its K/V written and verified, in the prefix cache under `hash` with `parent`
  // (publishes `stored`). False, changing nothing, when `hash` is cached already (keep that block) or
  // `block` is cached or unreferenced.
  bool enter_block(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens);

  // Engine thread, before the first step. Empty hooks: no tier sees anything.
  void set_block_hooks(KvBlockHooks hooks) { hooks_ = std::move(hooks); }

  KvCacheStats stats() const;
  KvSnapshot snapshot() const;
  const BlockPool& pool() const { return pool_; }
  const PrefixCache& cache() const { return cache_; }
  // For tests that forge cache states (collisions); keep the pool consistent.
  PrefixCache& cache_for_test() { return cache_; }
  std::shared_ptr<KvEventRing> events() const { return events_; }

  // Empty when the pool, the cache and the given live sequences (every sequence holding blocks)
  // agree; otherwise what is wrong. Tests call it after every step.
  std::string check_integrity(std::span<const Sequence* const> live) const;

 private:
  // A salted sequence hashes under its own root, so tenants never share blocks (Contract 1).
  BlockHash root_of(const Sequence& seq) const { return seq.hash_root ? seq.hash_root : cache_.root(); }
  void extend_hashes(Sequence& seq, std::size_t num_blocks) const;
  BlockId take_free_block(std::vector<BlockHash>& evicted);
  std::int32_t num_free_among(std::span<const BlockId> blocks) const;

  const std::int32_t block_size_;
  const bool prefix_caching_;
  BlockPool pool_;
  PrefixCache cache_;
  std::shared_ptr<KvEventRing> events_;
  std::uint64_t prefix_query_tokens_ = 0;
  std::uint64_t prefix_hit_tokens_ = 0;
  std::uint64_t evicted_blocks_ = 0;
  std::unordered_map<PinId, std::vector<BlockId>> pins_;
  PinId next_pin_ = 1;
  KvBlockHooks hooks_;
};

}  // namespace kvfleet
