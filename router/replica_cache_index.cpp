#include "router/replica_cache_index.h"

#include <cstdio>
#include <stdexcept>

namespace kvfleet::router {
namespace {

std::string hex(BlockHash h) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

ReplicaCacheIndex::ReplicaCacheIndex(ReplicaCacheConfig config, Log log)
    : config_(config), log_(std::move(log)), tree_(config.tree), tiers_(config.tiers) {}

ReplicaCacheIndex::Replica& ReplicaCacheIndex::at(ReplicaId r) {
  if (r >= kMaxReplicas || !replicas_[r].present) throw std::out_of_range("replica slot " + std::to_string(r) + " is not in use");
  return replicas_[r];
}

const ReplicaCacheIndex::Replica& ReplicaCacheIndex::at(ReplicaId r) const {
  return const_cast<ReplicaCacheIndex*>(this)->at(r);
}

void ReplicaCacheIndex::log(const std::string& line) const {
  if (log_) log_(line);
}

void ReplicaCacheIndex::add_replica(ReplicaId r) {
  if (r >= kMaxReplicas) throw std::out_of_range("replica slot " + std::to_string(r) + " >= " + std::to_string(kMaxReplicas));
  if (replicas_[r].present && replicas_[r].owner != r)
    throw std::out_of_range("replica slot " + std::to_string(r) + " is a rank of replica " + std::to_string(replicas_[r].owner));
  if (replicas_[r].present) remove_replica(r);  // a reused slot starts empty (its ranks' too)
  tree_.remove_replica(r);
  tiers_.remove_replica(r);
  drop_pending(r, false);
  replicas_[r] = Replica{};
  replicas_[r].present = true;
  replicas_[r].owner = r;
  replicas_[r].reason = "no event stream yet";
}

void ReplicaCacheIndex::remove_replica(ReplicaId r) {
  at(r);
  for (const ReplicaId s : targets(r)) {
    tree_.remove_replica(s);
    tiers_.remove_replica(s);
    drop_pending(s, false);
    replicas_[s] = Replica{};
  }
}

CacheMode ReplicaCacheIndex::mode(ReplicaId r) const { return at(at(r).owner).mode; }
const std::string& ReplicaCacheIndex::mode_reason(ReplicaId r) const { return at(at(r).owner).reason; }
std::uint64_t ReplicaCacheIndex::last_seq(ReplicaId r) const { return at(r).last_seq; }
std::uint64_t ReplicaCacheIndex::orphans_dropped(ReplicaId r) const { return at(r).orphans_dropped; }
std::uint64_t ReplicaCacheIndex::snapshots(ReplicaId r) const { return at(r).snapshots; }
bool ReplicaCacheIndex::in_snapshot(ReplicaId r) const { return at(r).snapshot_left > 0; }

void ReplicaCacheIndex::on_routed(ReplicaId r, std::span<const BlockHash> hashes, Tick now) {
  Replica& rep = at(at(r).owner);  // a rank slot follows its replica's stream
  if (rep.mode == CacheMode::exact) {
    add_pending(r, hashes, now);  // marks (and touches) the chain; its new blocks wait for their event
    return;
  }
  tree_.insert(r, hashes, now);
  rep.marks_mirror_last_seq = false;
}

std::size_t ReplicaCacheIndex::sweep(Tick now) {
  ReplicaMask approximate = 0;
  for (ReplicaId r = 0; r < kMaxReplicas; ++r) {
    if (replicas_[r].present && replicas_[replicas_[r].owner].mode == CacheMode::approximate)
      approximate |= ReplicaMask{1} << r;
  }
  expire_pending(now);
  const Tick cutoff = now > config_.approximate_ttl ? now - config_.approximate_ttl : 0;
  return approximate == 0 ? 0 : tree_.expire(approximate, cutoff);
}

void ReplicaCacheIndex::reset_marks(ReplicaId r) {
  for (const ReplicaId s : targets(r)) {
    tree_.clear_replica(s);
    tiers_.clear_replica(s);
    drop_pending(s, false);
  }
  replicas_[r].last_seq = 0;
  replicas_[r].snapshot_left = 0;
  replicas_[r].marks_mirror_last_seq = true;
}

std::uint64_t ReplicaCacheIndex::begin_stream(ReplicaId r) {
  Replica& rep = at(r);
  rep.stream_ok = false;
  for (const ReplicaId s : targets(r)) drop_pending(s, true);  // guesses: the replay (or snapshot) brings what is real
  if (!rep.marks_mirror_last_seq) reset_marks(r);
  rep.stream_since = rep.last_seq;
  return rep.last_seq;
}

void ReplicaCacheIndex::end_stream(ReplicaId r, std::string_view why) {
  Replica& rep = at(r);
  rep.stream_ok = false;
  rep.mode = CacheMode::approximate;
  rep.reason = std::string(why);
  log("replica " + std::to_string(r) + ": approximate mode (" + rep.reason + ")");
}

EventOutcome ReplicaCacheIndex::resync(ReplicaId r, std::string why) {
  Replica& rep = replicas_[r];
  rep.stream_ok = false;
  log("replica " + std::to_string(r) + ": resync needed from seq " + std::to_string(rep.last_seq) + " (" + why + ")");
  return EventOutcome{EventStatus::resync_needed, std::move(why), rep.last_seq};
}

EventOutcome ReplicaCacheIndex::apply_event(ReplicaId r, std::string_view json, Tick now) {
  at(r);
  KvEventMessage event;
  try {
    event = parse_kv_event(json);
  } catch (const std::invalid_argument& e) {
    // Something on the stream could not be read: what it said is lost, as after a gap.
    return resync(r, std::string("malformed event: ") + e.what());
  }
  return apply_event(r, event, now);
}

EventOutcome ReplicaCacheIndex::apply_config(ReplicaId r, const KvEventMessage& e) {
  Replica& rep = replicas_[r];
  std::string mismatch;
  if (e.block_size != config_.block_size) {
    mismatch = "block_size " + std::to_string(e.block_size) + " differs from the router's " + std::to_string(config_.block_size);
  } else if (e.root != config_.root) {
    mismatch = "root " + hex(e.root) + " differs from the router's " + hex(config_.root) +
               " (different model name or hashing)";
  }
  if (!mismatch.empty()) {
    rep.stream_ok = false;
    rep.mode = CacheMode::approximate;
    rep.reason = "config mismatch: " + mismatch;
    log("replica " + std::to_string(r) + ": approximate mode (" + rep.reason + ")");
    return EventOutcome{EventStatus::config_rejected, rep.reason, 0};
  }
  if (!rep.marks_mirror_last_seq) reset_marks(r);  // begin_stream was skipped: never build on guesses
  if (const Restart restart = restarted(r, e); restart != Restart::no) {
    reset_marks(r);
    // A seq below since= makes the replica send cleared + a snapshot on this stream; a new instance
    // whose seq passed since= would replay its own events after since=: meaningless here.
    if (restart == Restart::new_instance && rep.stream_since != 0) {
      // This stream replays the old instance's seqs after since=: start over from 0.
      rep.stream_since = 0;
      rep.mode = CacheMode::approximate;
      rep.reason = "replica restarted";
      return resync(r, "replica restarted (new instance): starting over from seq 0");
    }
  }
  if (tiers_.shared_id(r) != e.shared_tier && !tiers_.set_shared(r, e.shared_tier))
    log("replica " + std::to_string(r) + ": shared KV tier " + hex(e.shared_tier) + " not tracked (64 shared tiers known)");
  rep.stream_ok = true;
  rep.mode = CacheMode::exact;
  rep.reason = "kv events";
  log("replica " + std::to_string(r) + ": exact mode (kv events after seq " + std::to_string(rep.last_seq) + ")");
  return EventOutcome{EventStatus::config_accepted, {}, 0};
}

// A new instance id, or (replicas without one) a seq below what we applied.
ReplicaCacheIndex::Restart ReplicaCacheIndex::restarted(ReplicaId r, const KvEventMessage& e) {
  Replica& rep = replicas_[r];
  std::string why;
  Restart restart = Restart::no;
  if (e.instance && rep.instance && *e.instance != *rep.instance) {
    why = "instance changed from " + hex(*rep.instance) + " to " + hex(*e.instance);
    restart = Restart::new_instance;
  } else if (!e.instance && e.seq < rep.last_seq) {
    why = "seq went back to " + std::to_string(e.seq) + " from " + std::to_string(rep.last_seq);
    restart = Restart::seq_went_back;
  }
  if (e.instance) rep.instance = e.instance;
  if (restart != Restart::no) log("replica " + std::to_string(r) + ": restarted (" + why + "): dropping its marks");
  return restart;
}

EventOutcome ReplicaCacheIndex::apply_event(ReplicaId r, const KvEventMessage& e, Tick now) {
  Replica& rep = at(r);
  using Type = KvEventMessage::Type;
  if (e.type == Type::config) return apply_config(r, e);
  if (e.type == Type::load || e.type == Type::unknown)  // not about the cache (the gateway reads load)
    return EventOutcome{EventStatus::ignored, "not a cache event", 0};
  if (!rep.stream_ok) return EventOutcome{EventStatus::ignored, "no accepted config on this stream", 0};
  std::string bad_rank;
  if (e.type != Type::cleared && !target_of(r, e, bad_rank)) return resync(r, bad_rank);  // before its seq counts
  if (e.continuation) {
    if (e.seq != rep.last_seq) return resync(r, "continuation of seq " + std::to_string(e.seq) + " out of place");
    return apply_change(r, e, now);
  }
  if (e.type == Type::cleared) {
    for (const ReplicaId s : targets(r)) {
      tree_.clear_replica(s);
      tiers_.clear_replica(s);
      drop_pending(s, false);
    }
    rep.last_seq = e.seq;
    rep.snapshot_left = e.snapshot_blocks;
    rep.snapshots += e.snapshot_blocks > 0;
    rep.marks_mirror_last_seq = rep.snapshot_left == 0;  // an interrupted snapshot is not an image of seq S
    return {};
  }
  if (rep.snapshot_left > 0) {
    if (e.seq != rep.last_seq || e.type != Type::stored) {
      return resync(r, "snapshot at seq " + std::to_string(rep.last_seq) + " ended with " +
                           std::to_string(rep.snapshot_left) + " blocks missing");
    }
    if (--rep.snapshot_left == 0) rep.marks_mirror_last_seq = true;
    return apply_change(r, e, now);
  }
  if (e.seq <= rep.last_seq) {
    return EventOutcome{EventStatus::ignored, "seq " + std::to_string(e.seq) + " already applied", 0};
  }
  if (e.seq != rep.last_seq + 1) {
    return resync(r, "seq gap: expected " + std::to_string(rep.last_seq + 1) + ", got " + std::to_string(e.seq));
  }
  rep.last_seq = e.seq;
  return apply_change(r, e, now);
}

EventOutcome ReplicaCacheIndex::apply_change(ReplicaId stream, const KvEventMessage& e, Tick now) {
  std::string why;
  const ReplicaId r = target_of(stream, e, why).value_or(stream);  // checked by apply_event
  if (!e.medium) return {};  // a medium this router does not know: its seq counts, nothing else
  if (*e.medium != Medium::device) {
    apply_tier_change(r, e, now);
    return {};
  }
  if (e.type == KvEventMessage::Type::stored) {
    if (!e.parent || *e.parent == config_.root) {
      tree_.insert(r, e.block_hashes, now);
    } else if (!tree_.insert_after(r, *e.parent, e.block_hashes, now)) {
      replicas_[stream].orphans_dropped += 1;
    }
    confirm_pending(r, e.block_hashes);
  } else if (e.type == KvEventMessage::Type::removed) {
    tree_.remove(r, e.block_hashes);
    confirm_pending(r, e.block_hashes);  // gone for real: nothing pending about them any more
  }
  return {};
}

// A lower tier's stored/removed: per block, no prefix closure (TierIndex). A `stored` continuing a chain
// is still placed: the tier holds that block whatever holds its parent.
void ReplicaCacheIndex::apply_tier_change(ReplicaId r, const KvEventMessage& e, Tick now) {
  const bool stored = e.type == KvEventMessage::Type::stored;
  if (*e.medium == Medium::shared) {
    if (stored) tiers_.stored_shared(r, e.block_hashes, now);  // shared files are never removed by a replica
  } else if (stored) {
    tiers_.stored(r, *e.medium, e.block_hashes, now);
  } else if (e.type == KvEventMessage::Type::removed) {
    tiers_.removed(r, *e.medium, e.block_hashes);
  }
}

}  // namespace kvfleet::router
