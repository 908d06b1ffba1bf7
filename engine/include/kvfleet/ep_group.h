// EpGroup: an expert-parallel group of ep_size in-process ranks (engines in lockstep, engine/comm's
// in-process communicator) behind one front: what `kvfleet-replica --ep-size N` serves.
//
// Dispatch (data-parallel attention: each rank has its own scheduler and KV cache): a request goes to the
// rank holding the longest prefix of its prompt's block-hash chain (Contract 1, the request's cache_salt
// namespace), counting both what the rank's prefix cache holds (from its KV events) and the prompts of
// the requests it runs now (their blocks appear only after their prefill); with no match anywhere, to the
// rank with the fewest unfinished requests; ties go to the lower rank, so the choice is deterministic.
//
// KV events (Contract 2): the group publishes one merged ring, the union over the ranks: `stored` when the
// first rank stores a hash, `removed` when the last rank holding it drops it, each event carrying the
// dp_rank that caused it (additive field). A router sees one replica. The snapshot is the union.
// A second ring, kv_events_per_rank(), carries every rank's own stored/removed events with its dp_rank
// (a rank's `cleared` becomes a `removed` of what it held), so that a router can keep one tree per rank
// and route to (replica, rank) (`/v1/kv_events?per_rank=1`); its snapshot is each rank's cache.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/kv_cache_manager.h"
#include "kvfleet/kv_events.h"

namespace kvfleet {

class EpGroup {
 public:
  EpGroup(const Model& model, const EngineConfig& config, int ep_size);
  ~EpGroup();
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int size() const;
  Engine& rank(int r);
  void set_tokenizer(const Tokenizer* tokenizer);

  // The rank pick() would choose now for this prompt (no side effect).
  int pick(std::span<const TokenId> prompt, const std::string& cache_salt) const;
  struct Submitted {
    int rank = 0;
    RequestId id = 0;
  };
  // pick() + Engine::submit on that rank (the same exceptions); the rank counts the request as load and
  // its prompt as held until it finishes. `dp_rank` >= 0 (the request's data_parallel_rank hint, from
  // a router that follows the ranks' caches) is used instead of pick(); std::out_of_range when >= size().
  Submitted submit(GenerationRequest request, OutputCallback on_output, int dp_rank = -1);
  void abort(const Submitted& s);
  void abort_all(const std::string& error);

  // Summed over the ranks (MoE expert counts too: each rank counts its own experts).
  EngineStats stats() const;
  std::shared_ptr<KvEventRing> kv_events() const;
  KvSnapshot kv_snapshot() const;
  std::shared_ptr<KvEventRing> kv_events_per_rank() const;
  struct RankedSnapshot {
    std::uint64_t seq = 0;  // of kv_events_per_rank()
    struct Entry {
      BlockHash hash;
      BlockHash parent;
      std::int32_t dp_rank;
    };
    std::vector<Entry> blocks;  // rank by rank, parents first within each
  };
  RankedSnapshot kv_snapshot_per_rank() const;
  EngineStats rank_stats(int rank) const;  // one rank's own figures (its per-rank `load` event)
  std::int64_t unfinished(int rank) const;

 private:
  struct State;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::shared_ptr<State> state_;
  std::vector<std::shared_ptr<void>> subscriptions_;
};

}  // namespace kvfleet
