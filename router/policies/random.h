// random: a uniformly random available replica; a baseline for benchmarks, and a fair spreader
// when requests are alike.
//
// Algorithm: draw one of the available (healthy, not draining) replicas with equal probability
// from a 64-bit Mersenne Twister. The generator is seeded from the config, so tests and benchmark
// runs repeat exactly; without a seed it is seeded from std::random_device. Reason "random".
//
// Knobs: seed (optional non-negative integer).
#pragma once

#include <random>
#include <vector>

#include "router/policy.h"

namespace kvfleet::router {

class Knobs;

class RandomPolicy final : public Policy {
 public:
  explicit RandomPolicy(std::uint64_t seed) : rng_(seed) {}
  static std::unique_ptr<Policy> from_yaml(const YAML::Node& knobs);
  std::string_view name() const override { return "random"; }
  Decision choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) override;

 private:
  std::mt19937_64 rng_;
};

// The available replicas' indices, in order (random and power_of_two draw from these).
std::vector<std::size_t> available_indices(std::span<const ReplicaState> replicas);
// The configured seed, or one from std::random_device.
std::uint64_t seed_knob(Knobs& knobs);

}  // namespace kvfleet::router
