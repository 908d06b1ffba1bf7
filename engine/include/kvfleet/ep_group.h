// EpGroup: an expert-parallel group of ep_size ranks (engines in lockstep) behind one front: what
// `kvfleet-replica --ep-size N` serves. Either every rank is a thread of this process (engine/comm's
// in-process communicator), or each rank is its own process (`--ep-rank R --ep-master HOST:PORT`, Gloo
// or NCCL, `--ep-comm`):
// then this process is rank 0, runs its own engine, and reaches every rank r > 0 through a request
// channel (engine/ep/channel.h): one TCP connection per rank, which rank r listens for on a port
// it publishes in the rendezvous store, carrying submit / abort / abort_all one way and acks, per-step
// outputs (RequestOutput with text and finish), the rank's KV events and its stats (every 200 ms, also the
// heartbeat) the other way. A rank r > 0 is an EpWorker (kvfleet/ep_worker.h). The dispatcher sees every
// rank through EpRank, which a local engine and a remote rank both implement.
//
// Failure: a remote rank whose channel closes (its process exited) or stays silent for the timeout
// fails the group: every request in flight on any rank ends at once with an error naming that rank
// (failure() says it; submit() then throws), since the group's collectives cannot run without it.
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

#include <boost/json.hpp>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvfleet/communicator.h"
#include "kvfleet/engine.h"
#include "kvfleet/kv_cache_manager.h"
#include "kvfleet/kv_events.h"

namespace kvfleet {

// One data-parallel rank as the dispatcher sees it: a local engine or a remote rank's channel.
class EpRank {
 public:
  virtual ~EpRank() = default;
  // Engine::submit's contract: std::invalid_argument for a request this rank can never run (its own
  // context and KV capacity), std::runtime_error when the rank is gone.
  virtual RequestId submit(GenerationRequest request, OutputCallback on_output) = 0;
  virtual void abort(RequestId id) = 0;
  virtual void abort_all(const std::string& error) = 0;
  virtual EngineStats stats() const = 0;
  // The rank's KV events (a remote rank's arrive over the channel into a local ring).
  virtual std::shared_ptr<KvEventRing> kv_events() const = 0;
  // Called once (any thread) when the rank is gone, with why. Local engines never call it.
  virtual void on_failure(std::function<void(const std::string&)> /*handler*/) {}
  // The rank's /internal/kv_state figures (ep/wire.h's kv_state_json), taken on its engine thread between
  // steps, fresh: a remote rank asks over its channel. `done` runs once, on any thread; a rank that is
  // gone (or goes before answering) answers {"error": why}.
  virtual void kv_state(std::function<void(boost::json::object)> done) = 0;
  // The rank's EngineStats now: a local engine's at once, a remote rank's asked over its channel (a rank
  // that is gone answers with the figures it last sent). `done` runs once, on any thread.
  virtual void stats_now(std::function<void(EngineStats)> done) { done(stats()); }
  // Whether the rank's engine runs in this process. A request with a grammar (GenerationRequest::grammar,
  // a compiled object) cannot cross a process boundary: only such ranks run one.
  virtual bool in_process() const { return true; }
};

class EpGroup {
 public:
  EpGroup(const Model& model, const EngineConfig& config, int ep_size);
  // Rank 0 of a group of processes (comm.rank must be 0): joins the group (Gloo or NCCL, as
  // resolve_ep_comm(comm) says; an NCCL rank's engine computes on the communicator's GPU), starts this
  // rank's engine, then connects to every rank r > 0's channel (its address from the rendezvous store),
  // all within comm.join_timeout (or timeout) each. Throws std::runtime_error naming the rank that did
  // not come, std::invalid_argument for a communicator that cannot run here (resolve_ep_comm).
  EpGroup(const Model& model, const EngineConfig& config, const EpCommOptions& comm);
  ~EpGroup();
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int size() const;
  bool rank_in_process(int r) const;
  // An in-process rank's engine (rank 0 only when the ranks are processes; std::out_of_range otherwise).
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
  // A constrained request (a grammar) runs on an in-process rank: pick()'s choice when it is one, else rank
  // 0; std::invalid_argument when `dp_rank` names a rank in another process (rank_in_process).
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
  // stats() from every rank's stats_now (a scrape: remote ranks' figures fresh, not up to 200 ms old).
  // `done` runs once, on any thread, when every rank answered.
  void stats_now(std::function<void(EngineStats)> done) const;
  std::int64_t unfinished(int rank) const;
  // GET /internal/kv_state of the group: every rank's figures (kv_state above) in "ranks", each with its
  // dp_rank, and at the top the counts summed and "integrity" "ok" only when every rank said so (else
  // "rank R: problem; ..."). `done` runs once, on any thread, when every rank answered.
  void kv_state(std::function<void(boost::json::object)> done) const;
  // Empty while every rank is there; otherwise why the group broke (names the rank).
  std::string failure() const;

 private:
  struct State;
  void start_merging();
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::unique_ptr<EpRank>> ranks_;
  std::shared_ptr<State> state_;
  std::vector<std::shared_ptr<void>> subscriptions_;
};

}  // namespace kvfleet
