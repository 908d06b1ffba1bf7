#include "router/policies/round_robin.h"

#include "router/policy_knobs.h"

namespace kvfleet::router {

std::unique_ptr<Policy> RoundRobinPolicy::from_yaml(const YAML::Node& node) {
  Knobs("round_robin", node).finish();
  return std::make_unique<RoundRobinPolicy>();
}

Decision RoundRobinPolicy::choose(const RoutingRequest&, std::span<const ReplicaState> replicas) {
  const std::size_t n = replicas.size();
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (next_ + k) % n;
    if (!replicas[i].available()) continue;
    next_ = (i + 1) % n;
    return Decision{i, "round_robin"};
  }
  return Decision{Decision::kNone, kNoReplica};
}

}  // namespace kvfleet::router
