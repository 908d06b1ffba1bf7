// ReplicaCacheIndex, the ranks of expert-parallel replicas (replica_cache_index.h, "Ranks"): one tree
// slot per (replica, data-parallel rank), all fed by the replica's one per-rank event stream.
#include <stdexcept>

#include "router/replica_cache_index.h"

namespace kvfleet::router {

std::vector<ReplicaId> ReplicaCacheIndex::targets(ReplicaId r) const {
  const Replica& rep = replicas_[r];
  return rep.ranks.empty() ? std::vector<ReplicaId>{r} : rep.ranks;
}

std::optional<ReplicaId> ReplicaCacheIndex::target_of(ReplicaId r, const KvEventMessage& e, std::string& why) const {
  const auto& ranks = replicas_[r].ranks;
  if (ranks.empty()) return r;  // no ranks: a union stream's dp_rank says nothing about where blocks are
  if (e.dp_rank < 0) {
    why = "an event without dp_rank on a per-rank stream";
    return std::nullopt;
  }
  if (static_cast<std::size_t>(e.dp_rank) >= ranks.size()) {
    why = "dp_rank " + std::to_string(e.dp_rank) + " out of range (dp_size " + std::to_string(ranks.size()) + ")";
    return std::nullopt;
  }
  return ranks[static_cast<std::size_t>(e.dp_rank)];
}

std::vector<ReplicaId> ReplicaCacheIndex::set_ranks(ReplicaId r, std::uint32_t n) {
  Replica& rep = at(r);
  if (rep.owner != r) throw std::out_of_range("replica slot " + std::to_string(r) + " is a rank of another replica");
  const std::size_t want = n > 1 ? n : 0;
  if (rep.ranks.size() == want) return rep.ranks;
  std::vector<ReplicaId> slots;
  if (want > 0) {
    slots.push_back(r);
    for (ReplicaId s = 0; s < kMaxReplicas && slots.size() < want; ++s)
      if (s != r && (!replicas_[s].present || replicas_[s].owner == r)) slots.push_back(s);
    if (slots.size() < want)
      throw std::out_of_range(std::to_string(n) + " ranks need " + std::to_string(want - 1) + " free replica slots of " +
                              std::to_string(kMaxReplicas));
  }
  // A new shape: what the old ranks held says nothing about the new ones.
  reset_marks(r);
  rep.marks_mirror_last_seq = false;  // the next stream starts over from seq 0
  for (const ReplicaId s : rep.ranks) {
    if (s == r) continue;
    tree_.remove_replica(s);
    replicas_[s] = Replica{};
  }
  for (const ReplicaId s : slots) {
    if (s == r) continue;
    tree_.remove_replica(s);
    drop_pending(s, false);
    replicas_[s] = Replica{};
    replicas_[s].present = true;
    replicas_[s].owner = r;
  }
  rep.ranks = slots;
  log("replica " + std::to_string(r) + ": " + (want ? std::to_string(want) + " data-parallel ranks" : "no ranks"));
  return slots;
}

}  // namespace kvfleet::router
