// consistent_hash: requests of one session (the value of a configured header, e.g. a user or
// conversation id) go to the same replica, so a multi-turn chat keeps hitting its own KV cache
// even with approximate cache knowledge.
//
// Algorithm: a hash ring. Each replica owns `virtual_nodes` points, at XXH3(id, seed = k) for
// k = 0..virtual_nodes-1, where id is the replica's stable name; a key hashes to XXH3(key) and
// belongs to the first point clockwise from it. Points depend on names only, so adding a replica
// moves to it only the keys that fall on its new points, and removing one moves only its own keys;
// every other key stays put. The ring holds every configured replica, healthy or not: when the
// owner is unavailable (unhealthy, draining) the walk goes on clockwise to the next available
// owner, and the key returns when its owner recovers. More virtual nodes spread keys more evenly
// (about 1/sqrt(virtual_nodes) relative spread) at the cost of a bigger ring. The ring is rebuilt
// when the list of replica ids changes. Reason "session_hash"; a request without a session key
// goes to the least loaded replica, reason "no_session_key".
//
// Knobs: header ("x-session-id": the request header to read), virtual_nodes (160, 1..10000).
#pragma once

#include <utility>
#include <vector>

#include "router/policy.h"

namespace kvfleet::router {

struct ConsistentHashConfig {
  std::string header = "x-session-id";
  std::uint32_t virtual_nodes = 160;
};

class ConsistentHashPolicy final : public Policy {
 public:
  explicit ConsistentHashPolicy(ConsistentHashConfig config = {}) : config_(std::move(config)) {}
  static std::unique_ptr<Policy> from_yaml(const YAML::Node& knobs);

  std::string_view name() const override { return "consistent_hash"; }
  std::string_view session_header() const override { return config_.header; }
  Decision choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) override;

 private:
  void rebuild_if_changed(std::span<const ReplicaState> replicas);

  ConsistentHashConfig config_;
  std::vector<std::string> ids_;                             // the replica list the ring was built for
  std::vector<std::pair<std::uint64_t, std::size_t>> ring_;  // (point, replica index), sorted
};

}  // namespace kvfleet::router
