#include "router/policies/random.h"

#include "router/policy_knobs.h"

namespace kvfleet::router {

std::vector<std::size_t> available_indices(std::span<const ReplicaState> replicas) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    if (replicas[i].available()) out.push_back(i);
  }
  return out;
}

std::uint64_t seed_knob(Knobs& knobs) {
  if (const auto seed = knobs.optional_integer("seed")) return *seed;
  std::random_device device;
  return (std::uint64_t{device()} << 32) | device();
}

std::unique_ptr<Policy> RandomPolicy::from_yaml(const YAML::Node& node) {
  Knobs knobs("random", node);
  const std::uint64_t seed = seed_knob(knobs);
  knobs.finish();
  return std::make_unique<RandomPolicy>(seed);
}

Decision RandomPolicy::choose(const RoutingRequest&, std::span<const ReplicaState> replicas) {
  const std::vector<std::size_t> pool = available_indices(replicas);
  if (pool.empty()) return Decision{Decision::kNone, kNoReplica};
  return Decision{pool[rng_() % pool.size()], "random"};
}

}  // namespace kvfleet::router
