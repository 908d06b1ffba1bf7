#include "router/policies/least_load.h"

#include "router/policy_knobs.h"

namespace kvfleet::router {

std::unique_ptr<Policy> LeastLoadPolicy::from_yaml(const YAML::Node& node) {
  Knobs("least_load", node).finish();
  return std::make_unique<LeastLoadPolicy>();
}

Decision LeastLoadPolicy::choose(const RoutingRequest&, std::span<const ReplicaState> replicas) {
  const std::optional<std::size_t> least = least_loaded(replicas);
  return least ? Decision{*least, "least_load"} : Decision{Decision::kNone, kNoReplica};
}

}  // namespace kvfleet::router
