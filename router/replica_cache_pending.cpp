// ReplicaCacheIndex, exact mode's pending marks (replica_cache_index.h): a routing decision marks the
// blocks the chosen replica is about to compute, until its stored event confirms them or pending_ttl
// passes. The marks live in the tree like any other (match() sees them); pending_ remembers which of
// them no event has confirmed yet, so that only those expire.
#include "router/replica_cache_index.h"

namespace kvfleet::router {

void ReplicaCacheIndex::add_pending(ReplicaId r, std::span<const BlockHash> hashes, Tick now) {
  if (hashes.empty()) return;
  const std::uint32_t held = tree_.match(hashes).of(r);  // confirmed or pending already
  PendingRoute route{now + config_.pending_ttl, r, {}};
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    const PendingKey key{hashes[i], r};
    if (auto it = pending_.find(key); it != pending_.end()) {
      it->second = route.expires;  // a later route waits again for the same blocks
    } else if (i < held) {
      continue;  // confirmed by an event
    } else {
      pending_.emplace(key, route.expires);
    }
    route.hashes.push_back(hashes[i]);
  }
  tree_.insert(r, hashes, now);  // the held part is only touched
  if (!route.hashes.empty()) pending_routes_.push_back(std::move(route));
}

void ReplicaCacheIndex::confirm_pending(ReplicaId r, std::span<const BlockHash> hashes) {
  if (pending_.empty()) return;
  for (BlockHash h : hashes) pending_confirmed_ += pending_.erase(PendingKey{h, r});
}

void ReplicaCacheIndex::drop_pending(ReplicaId r, bool from_tree) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->first.replica != r) {
      ++it;
      continue;
    }
    if (from_tree) {
      const BlockHash h = it->first.hash;
      tree_.remove(r, std::span<const BlockHash>(&h, 1));
    }
    it = pending_.erase(it);
  }
}

// A block whose route expired and that no later route refreshed: its mark goes, with what hangs below
// it (pending too: a replica's child block is confirmed only after its parent).
void ReplicaCacheIndex::expire_pending(Tick now) {
  while (!pending_routes_.empty() && pending_routes_.front().expires <= now) {
    const PendingRoute& route = pending_routes_.front();
    for (const BlockHash h : route.hashes) {
      const auto it = pending_.find(PendingKey{h, route.replica});
      if (it == pending_.end() || it->second > now) continue;
      pending_.erase(it);
      tree_.remove(route.replica, std::span<const BlockHash>(&h, 1));
      pending_expired_ += 1;
    }
    pending_routes_.pop_front();
  }
}

}  // namespace kvfleet::router
