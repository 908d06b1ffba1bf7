// KV cache events for Contract 2 (docs/architecture.md): what the prefix cache stored, removed or
// cleared, each with a sequence number that grows by one per event, kept in a bounded ring so a
// router that reconnects with `since=SEQ` gets a replay, or learns that it fell behind (then it
// wants a `cleared` + full snapshot, which the engine thread builds from the PrefixCache).
//
// Thread-safety: the engine thread publishes; any thread (the HTTP server's SSE sessions) may call
// the const readers and subscribe() concurrently. One mutex guards everything; events
// are small. Listeners run on the publishing thread after the mutex is released: they must be quick
// (post a wake-up to an io thread) and must not call publish().
//
// The instance id is drawn at construction (random bits mixed with the clock and the pid), so a
// replica that restarts is told apart even when its new seqs have passed a reader's since=.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "kvfleet/block_hash.h"
#include "kvfleet/kv_tier_config.h"

namespace kvfleet {

struct KvEvent {
  enum class Type : std::uint8_t { stored, removed, cleared };
  std::uint64_t seq = 0;
  Type type = Type::stored;
  std::vector<BlockHash> block_hashes;  // stored: a chain, each the parent of the next
  BlockHash parent = 0;                 // stored: the hash before block_hashes[0] (the root for a first block)
  std::int32_t dp_rank = -1;            // an expert-parallel replica's merged stream: the rank that caused it
  KvMedium medium = KvMedium::device;   // the tier the blocks entered or left (engine/kvtier)
};

const char* to_string(KvEvent::Type type);

struct KvReplay {
  // True when events after `since` were already dropped from the ring, or `since` is ahead of the
  // newest event (the replica restarted): the reader must start over from a snapshot.
  bool fell_behind = false;
  std::vector<KvEvent> events;  // seq > since, oldest first (empty when fell_behind)
  std::uint64_t last_seq = 0;   // the newest seq published so far
};

class KvEventRing {
 public:
  // `block_size` and `root` go into the stream's opening `config` event, so a router can check
  // that it computes the same hashes.
  KvEventRing(std::size_t capacity, std::int32_t block_size, BlockHash root);

  std::int32_t block_size() const { return block_size_; }
  BlockHash root() const { return root_; }
  std::uint64_t instance() const { return instance_; }

  // Engine thread. Returns the new event's seq (the first event gets 1).
  std::uint64_t publish(KvEvent::Type type, std::vector<BlockHash> block_hashes = {}, BlockHash parent = 0,
                        std::int32_t dp_rank = -1, KvMedium medium = KvMedium::device);

  // Any thread.
  std::uint64_t last_seq() const;
  KvReplay since(std::uint64_t seq) const;
  // Blocks until an event newer than `seq` exists or `timeout` passes; returns last_seq().
  // `notify` runs after every publish while the returned handle lives (drop it to unsubscribe; a
  // call already under way may still finish after that, so `notify` must own what it touches).
  using Listener = std::function<void()>;
  std::shared_ptr<void> subscribe(Listener notify) const;

 private:
  const std::size_t capacity_;
  const std::int32_t block_size_;
  const BlockHash root_;
  const std::uint64_t instance_;
  mutable std::mutex mu_;
  mutable std::vector<std::weak_ptr<Listener>> listeners_;  // guarded by mu_
  std::deque<KvEvent> ring_;    // guarded by mu_
  std::uint64_t last_seq_ = 0;  // guarded by mu_
};

}  // namespace kvfleet
