// ReplicaCacheIndex: the router's knowledge of every replica's KV cache, kept in one PrefixTree,
// with a mode per replica (docs/architecture.md, Contract 2):
//   - exact: the replica's KV event stream is up and its opening config matched ours; what the
//     replica holds comes from its events (stored, removed, cleared). A routing decision refreshes
//     the last-use ticks of what it reused (touch) and leaves a *pending* mark on the blocks the
//     replica does not hold yet: the prefill it was just sent will store them, but its events say so
//     only after the prefill, and requests with the same prefix that arrive meanwhile must go to the
//     same place. A stored event confirms a pending block (it is an ordinary mark from then on); one
//     not confirmed within `pending_ttl` is dropped by sweep() (with what hangs below it). Events
//     stay the truth: `cleared`, a reconnect (begin_stream) and a removal drop the pending marks.
//   - approximate: no usable stream (none yet, down, config mismatch). A routing decision inserts
//     the prompt's hashes for the chosen replica (a guess: it will cache them), and sweep() ages
//     these marks out after `approximate_ttl`; the tree's LRU memory bound applies to everyone.
//
// Sequence numbers. Events must arrive with seq = last applied + 1. A larger seq is a gap: the
// event is not applied, the stream is marked untrusted and apply_event says resync_needed with the
// seq to resume from (reconnect with since=that: the replica replays, or sends cleared + a
// snapshot when its ring no longer reaches back). A smaller seq is a replay overlap and is ignored.
// "cleared" is accepted at any seq and restarts the count from its own seq.
//
// Snapshots. A replica that cannot replay from since= sends {"type":"cleared","seq":S,"snapshot":K}
// and then K `stored` events that all carry seq S (its whole cache at S, parents first). They are
// applied in full while the snapshot is open; the next event must be S + 1. A stream that ends
// before the K-th leaves an incomplete image, so the next stream starts from 0.
//
// Restarts. The config event carries the replica's instance id (new at every start). When it
// differs from the one we followed, the marks are dropped and, if this stream asked for since > 0
// (a replay of the old instance's seqs, meaningless now), resync_needed with resume_from 0. A
// config without an instance whose seq is below our last applied one means the same (older replicas).
//
// Chains whose parent the tree does not have (it evicted it) are dropped, not placed at the root
// (PrefixTree::insert_after); orphans_dropped() counts them.
//
// Reconnecting. begin_stream() returns the since= to use. When the replica's marks are no longer
// an image of its events (guesses were inserted while it was approximate, or it never synced),
// they are dropped first and it returns 0, so the replica sends everything it has. Marks lost to
// TTL or to the LRU bound only make the image a subset, which is harmless, so they do not force a
// full resync.
//
// Ranks. An expert-parallel replica serves several data-parallel ranks behind one endpoint, each with
// its own KV cache. On a per-rank stream (its config says per_rank and dp_size N > 1) set_ranks(r, N)
// makes each rank a routing target with a tree slot of its own (rank 0: r itself; the others: free
// slots), and every stored/removed event goes to its dp_rank's slot. The stream state (seq, instance,
// snapshot, mode) stays r's: mode(slot) of a rank slot is its replica's; a cleared, a restart, a
// reconnect's dropped guesses and a removal apply to every rank. Without ranks dp_rank is ignored (the
// union stream of older replicas).
//
// Tiers. Events with a `medium` below the device pool (host, disk, shared) go to a TierIndex next to the
// tree (router/tier_index.h): per block, the replicas whose host or disk tier holds it and the shared tiers
// that do. The config event's `shared_tier` puts the replica in that shared tier's group. A cleared event, a
// restart, a reconnect that starts over and a removal drop the replica's host and disk marks (the snapshot
// that follows lists them again, with their medium); shared marks belong to the group and stay. match_tiers() walks a prompt as the
// replica's engine would: its device prefix, then host, disk or shared block after block.
//
// Thread-safety: none (as PrefixTree). The router owns one index behind its own lock or strand.
#pragma once

#include <array>
#include <deque>
#include <unordered_map>
#include <vector>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "router/kv_event.h"
#include "router/prefix_tree.h"

namespace kvfleet::router {

enum class CacheMode : std::uint8_t { approximate, exact };

struct ReplicaCacheConfig {
  std::uint64_t block_size = 16;      // the router's own, checked against each stream's config
  BlockHash root = 0;                 // block_hash_root(model name): ditto
  Tick approximate_ttl = 120'000;     // ticks (the router: ms) an approximate mark outlives its last use
  Tick pending_ttl = 20'000;          // exact mode: how long a pending mark waits for its stored event
  PrefixTreeConfig tree{};
  TierIndexConfig tiers{};
};

enum class EventStatus : std::uint8_t {
  applied,          // the tree now reflects it
  config_accepted,  // the replica is in exact mode
  config_rejected,  // block size or root differ: the replica stays approximate (message says why)
  ignored,          // a replayed seq, or no accepted config on this stream yet
  resync_needed,    // a seq gap or a malformed event: reconnect with since=resume_from
};

struct EventOutcome {
  EventStatus status = EventStatus::applied;
  std::string message;            // empty when applied
  std::uint64_t resume_from = 0;  // resync_needed
};

class ReplicaCacheIndex {
 public:
  using Log = std::function<void(std::string_view)>;
  explicit ReplicaCacheIndex(ReplicaCacheConfig config, Log log = {});

  // Slots are assigned by the replica set; a new replica starts approximate. Throws
  // std::out_of_range for a slot >= kMaxReplicas.
  void add_replica(ReplicaId r);
  void remove_replica(ReplicaId r);  // forgets its marks and its stream state (and its ranks')
  bool in_use(ReplicaId slot) const { return slot < kMaxReplicas && replicas_[slot].present; }
  // r's stream is about n data-parallel ranks (n <= 1: none). Returns the rank slots in rank order
  // (rank 0 = r; empty when n <= 1). A different n than before drops every mark of r's ranks. Throws
  // std::out_of_range when fewer than n - 1 slots are free (nothing changes then).
  std::vector<ReplicaId> set_ranks(ReplicaId r, std::uint32_t n);
  const std::vector<ReplicaId>& ranks(ReplicaId r) const { return at(r).ranks; }
  CacheMode mode(ReplicaId r) const;
  const std::string& mode_reason(ReplicaId r) const;
  std::uint64_t last_seq(ReplicaId r) const;
  std::uint64_t orphans_dropped(ReplicaId r) const;
  std::uint64_t snapshots(ReplicaId r) const;  // `cleared` events that opened a snapshot
  bool in_snapshot(ReplicaId r) const;

  MatchResult match(std::span<const BlockHash> hashes) const { return tree_.match(hashes); }
  // Per replica, the leading blocks it reaches through its device pool and its lower tiers, by medium;
  // `device` is match(hashes).
  TierMatch match_tiers(std::span<const BlockHash> hashes, const MatchResult& device) const {
    return tiers_.match(hashes, device);
  }
  // The request with these prompt hashes was routed to r at `now`.
  void on_routed(ReplicaId r, std::span<const BlockHash> hashes, Tick now);
  // Drops approximate marks unused for approximate_ttl and pending marks older than pending_ttl;
  // returns how many approximate marks (the pending ones: pending_expired()).
  std::size_t sweep(Tick now);
  std::size_t pending_blocks() const { return pending_.size(); }  // (block, replica) pending now
  std::uint64_t pending_confirmed() const { return pending_confirmed_; }
  std::uint64_t pending_expired() const { return pending_expired_; }

  std::uint64_t begin_stream(ReplicaId r);
  EventOutcome apply_event(ReplicaId r, std::string_view json, Tick now);
  EventOutcome apply_event(ReplicaId r, const KvEventMessage& event, Tick now);
  // The stream broke or could not be opened: approximate mode until a new config is accepted.
  void end_stream(ReplicaId r, std::string_view why);

  const PrefixTree& tree() const { return tree_; }
  const TierIndex& tiers() const { return tiers_; }

 private:
  struct Replica {
    bool present = false;
    CacheMode mode = CacheMode::approximate;
    std::string reason;
    std::uint64_t last_seq = 0;
    bool stream_ok = false;  // a config was accepted on the current stream and no gap since
    // The marks mirror the replica's cache as of last_seq: they are what events up to last_seq left (or
    // a subset: TTL, LRU), so a stream may go on from there. False before the first sync, during a
    // snapshot and after any approximate insert (a guess may be a superset).
    bool marks_mirror_last_seq = false;
    std::optional<std::uint64_t> instance;  // the replica instance the marks came from
    std::uint64_t stream_since = 0;         // since= of the current stream (begin_stream)
    std::uint64_t snapshot_left = 0;        // snapshot `stored` events still expected at last_seq
    std::uint64_t orphans_dropped = 0;
    std::uint64_t snapshots = 0;
    ReplicaId owner = 0;              // the replica whose stream feeds this slot (itself, or a rank's replica)
    std::vector<ReplicaId> ranks;     // on the owner: its rank slots (rank 0 = itself); empty: no ranks
  };

  Replica& at(ReplicaId r);
  const Replica& at(ReplicaId r) const;
  std::vector<ReplicaId> targets(ReplicaId r) const;  // r's slots: its ranks', or r alone
  // The slot a stored/removed event of r's stream is about; nullopt (with why) for a bad dp_rank.
  std::optional<ReplicaId> target_of(ReplicaId r, const KvEventMessage& e, std::string& why) const;
  void reset_marks(ReplicaId r);
  EventOutcome apply_config(ReplicaId r, const KvEventMessage& event);
  EventOutcome resync(ReplicaId r, std::string why);
  EventOutcome apply_change(ReplicaId r, const KvEventMessage& event, Tick now);
  void apply_tier_change(ReplicaId r, const KvEventMessage& event, Tick now);
  enum class Restart : std::uint8_t { no, new_instance, seq_went_back };
  Restart restarted(ReplicaId r, const KvEventMessage& config);
  void log(const std::string& line) const;
  // replica_cache_pending.cpp
  void add_pending(ReplicaId r, std::span<const BlockHash> hashes, Tick now);
  void confirm_pending(ReplicaId r, std::span<const BlockHash> hashes);
  void drop_pending(ReplicaId r, bool from_tree);
  void expire_pending(Tick now);

  struct PendingKey {
    BlockHash hash;
    ReplicaId replica;
    bool operator==(const PendingKey&) const = default;
  };
  struct PendingKeyHash {
    std::size_t operator()(const PendingKey& k) const { return k.hash ^ (std::size_t{k.replica} * 0x9E3779B97F4A7C15ull); }
  };
  struct PendingRoute {  // one routing decision's new blocks, in expiry order
    Tick expires;
    ReplicaId replica;
    std::vector<BlockHash> hashes;
  };

  ReplicaCacheConfig config_;
  Log log_;
  PrefixTree tree_;
  TierIndex tiers_;
  std::array<Replica, kMaxReplicas> replicas_;
  std::unordered_map<PendingKey, Tick, PendingKeyHash> pending_;  // -> expiry (the latest route's)
  std::deque<PendingRoute> pending_routes_;                       // expiry order (one TTL for all)
  std::uint64_t pending_confirmed_ = 0, pending_expired_ = 0;
};

}  // namespace kvfleet::router
