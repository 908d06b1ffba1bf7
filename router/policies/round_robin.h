// round_robin: replicas take turns, in the order of the replica list, ignoring cache and load.
//
// Algorithm: a cursor remembers where the last choice was; the next available (healthy, not
// draining) replica at or after the cursor wins, and the cursor moves past it. Unavailable
// replicas are skipped without losing the rotation. Reason "round_robin".
//
// Knobs: none.
#pragma once

#include "router/policy.h"

namespace kvfleet::router {

class RoundRobinPolicy final : public Policy {
 public:
  static std::unique_ptr<Policy> from_yaml(const YAML::Node& knobs);
  std::string_view name() const override { return "round_robin"; }
  Decision choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) override;

 private:
  std::size_t next_ = 0;
};

}  // namespace kvfleet::router
