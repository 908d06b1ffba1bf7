// least_load: send each request to the least busy replica, ignoring the cache.
//
// Algorithm: among available (healthy, not draining) replicas, the one with the fewest requests in
// flight; ties go to the fewest tokens in flight (a replica busy with long prompts is busier),
// then to the lowest index, so the choice is deterministic. Reason "least_load".
//
// Knobs: none.
#pragma once

#include "router/policy.h"

namespace kvfleet::router {

class LeastLoadPolicy final : public Policy {
 public:
  static std::unique_ptr<Policy> from_yaml(const YAML::Node& knobs);
  std::string_view name() const override { return "least_load"; }
  Decision choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) override;
};

}  // namespace kvfleet::router
