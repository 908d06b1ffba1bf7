#include "router/policies/consistent_hash.h"

#include <xxhash.h>

#include <algorithm>

#include "router/policy_knobs.h"

namespace kvfleet::router {

std::unique_ptr<Policy> ConsistentHashPolicy::from_yaml(const YAML::Node& node) {
  Knobs knobs("consistent_hash", node);
  ConsistentHashConfig c;
  c.header = knobs.text("header", c.header);
  c.virtual_nodes = static_cast<std::uint32_t>(knobs.integer("virtual_nodes", c.virtual_nodes, 1, 10000));
  knobs.finish();
  return std::make_unique<ConsistentHashPolicy>(c);
}

void ConsistentHashPolicy::rebuild_if_changed(std::span<const ReplicaState> replicas) {
  const bool same = ids_.size() == replicas.size() &&
                    std::equal(ids_.begin(), ids_.end(), replicas.begin(),
                               [](const std::string& id, const ReplicaState& r) { return id == r.id; });
  if (same) return;
  ids_.clear();
  ring_.clear();
  ring_.reserve(replicas.size() * config_.virtual_nodes);
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    ids_.push_back(replicas[i].id);
    for (std::uint32_t k = 0; k < config_.virtual_nodes; ++k) {
      ring_.emplace_back(XXH3_64bits_withSeed(replicas[i].id.data(), replicas[i].id.size(), k), i);
    }
  }
  std::sort(ring_.begin(), ring_.end());
}

Decision ConsistentHashPolicy::choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) {
  if (request.session_key.empty()) {
    const std::optional<std::size_t> least = least_loaded(replicas);
    return least ? Decision{*least, "no_session_key"} : Decision{Decision::kNone, kNoReplica};
  }
  rebuild_if_changed(replicas);
  if (ring_.empty()) return Decision{Decision::kNone, kNoReplica};
  const std::uint64_t key = XXH3_64bits(request.session_key.data(), request.session_key.size());
  const auto start = std::lower_bound(ring_.begin(), ring_.end(), std::pair{key, std::size_t{0}});
  const auto first = static_cast<std::size_t>(start - ring_.begin());
  for (std::size_t k = 0; k < ring_.size(); ++k) {
    const std::size_t owner = ring_[(first + k) % ring_.size()].second;
    if (replicas[owner].available()) return Decision{owner, "session_hash"};
  }
  return Decision{Decision::kNone, kNoReplica};
}

}  // namespace kvfleet::router
