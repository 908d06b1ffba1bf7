// power_of_two ("power of two choices"): draw two different available replicas at random and send
// the request to the less loaded of the two. Nearly as even as least_load, but without every router
// herding onto the same momentarily idle replica (Mitzenmacher; Envoy's LEAST_REQUEST).
//
// Algorithm: from the available (healthy, not draining) replicas, draw a first and then a second,
// different one uniformly (64-bit Mersenne Twister); choose the one with fewer requests in flight,
// then fewer tokens in flight; on a full tie, the first drawn. One available replica: that one.
// Reason "power_of_two". The seed comes from the config (tests, repeatable benchmarks) or, when
// absent, from std::random_device.
//
// Knobs: seed (optional non-negative integer).
#pragma once

#include <random>

#include "router/policy.h"

namespace kvfleet::router {

class PowerOfTwoPolicy final : public Policy {
 public:
  explicit PowerOfTwoPolicy(std::uint64_t seed) : rng_(seed) {}
  static std::unique_ptr<Policy> from_yaml(const YAML::Node& knobs);
  std::string_view name() const override { return "power_of_two"; }
  Decision choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) override;

 private:
  std::mt19937_64 rng_;
};

}  // namespace kvfleet::router
