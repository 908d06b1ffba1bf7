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
    : config_(config), log_(std::move(log)), tree_(config.tree) {}

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
  tree_.remove_replica(r);  // a reused slot starts empty
  replicas_[r] = Replica{.present = true, .reason = "no event stream yet"};
}

void ReplicaCacheIndex::remove_replica(ReplicaId r) {
  at(r);
  tree_.remove_replica(r);
  replicas_[r] = Replica{};
}

CacheMode ReplicaCacheIndex::mode(ReplicaId r) const { return at(r).mode; }
const std::string& ReplicaCacheIndex::mode_reason(ReplicaId r) const { return at(r).reason; }
std::uint64_t ReplicaCacheIndex::last_seq(ReplicaId r) const { return at(r).last_seq; }

void ReplicaCacheIndex::on_routed(ReplicaId r, std::span<const BlockHash> hashes, Tick now) {
  Replica& rep = at(r);
  if (rep.mode == CacheMode::exact) {
    tree_.touch(r, hashes, now);
    return;
  }
  tree_.insert(r, hashes, now);
  rep.image_ok = false;
}

std::size_t ReplicaCacheIndex::sweep(Tick now) {
  ReplicaMask approximate = 0;
  for (ReplicaId r = 0; r < kMaxReplicas; ++r) {
    if (replicas_[r].present && replicas_[r].mode == CacheMode::approximate) approximate |= ReplicaMask{1} << r;
  }
  const Tick cutoff = now > config_.approximate_ttl ? now - config_.approximate_ttl : 0;
  return approximate == 0 ? 0 : tree_.expire(approximate, cutoff);
}

void ReplicaCacheIndex::reset_marks(ReplicaId r) {
  tree_.clear_replica(r);
  replicas_[r].last_seq = 0;
  replicas_[r].image_ok = true;
}

std::uint64_t ReplicaCacheIndex::begin_stream(ReplicaId r) {
  Replica& rep = at(r);
  rep.stream_ok = false;
  if (!rep.image_ok) reset_marks(r);
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
  if (!rep.image_ok) reset_marks(r);  // begin_stream was skipped: never build on guesses
  if (e.seq < rep.last_seq) {
    log("replica " + std::to_string(r) + ": seq went back to " + std::to_string(e.seq) + " from " +
        std::to_string(rep.last_seq) + " (restarted): dropping its marks");
    reset_marks(r);
  }
  rep.stream_ok = true;
  rep.mode = CacheMode::exact;
  rep.reason = "kv events";
  log("replica " + std::to_string(r) + ": exact mode (kv events after seq " + std::to_string(rep.last_seq) + ")");
  return EventOutcome{EventStatus::config_accepted, {}, 0};
}

EventOutcome ReplicaCacheIndex::apply_event(ReplicaId r, const KvEventMessage& e, Tick now) {
  Replica& rep = at(r);
  using Type = KvEventMessage::Type;
  if (e.type == Type::config) return apply_config(r, e);
  if (!rep.stream_ok) return EventOutcome{EventStatus::ignored, "no accepted config on this stream", 0};
  if (e.type == Type::cleared) {
    tree_.clear_replica(r);
    rep.last_seq = e.seq;
    return {};
  }
  if (e.seq <= rep.last_seq) {
    return EventOutcome{EventStatus::ignored, "seq " + std::to_string(e.seq) + " already applied", 0};
  }
  if (e.seq != rep.last_seq + 1) {
    return resync(r, "seq gap: expected " + std::to_string(rep.last_seq + 1) + ", got " + std::to_string(e.seq));
  }
  if (e.type == Type::stored) {
    if (!e.parent || *e.parent == config_.root) {
      tree_.insert(r, e.block_hashes, now);
    } else {
      tree_.insert_after(r, *e.parent, e.block_hashes, now);
    }
  } else {
    tree_.remove(r, e.block_hashes);
  }
  rep.last_seq = e.seq;
  return {};
}

}  // namespace kvfleet::router
