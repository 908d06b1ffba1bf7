#include "router/policies/power_of_two.h"

#include "router/policies/random.h"
#include "router/policy_knobs.h"

namespace kvfleet::router {

std::unique_ptr<Policy> PowerOfTwoPolicy::from_yaml(const YAML::Node& node) {
  Knobs knobs("power_of_two", node);
  const std::uint64_t seed = seed_knob(knobs);
  knobs.finish();
  return std::make_unique<PowerOfTwoPolicy>(seed);
}

Decision PowerOfTwoPolicy::choose(const RoutingRequest&, std::span<const ReplicaState> replicas) {
  const std::vector<std::size_t> pool = available_indices(replicas);
  if (pool.empty()) return Decision{Decision::kNone, kNoReplica};
  if (pool.size() == 1) return Decision{pool[0], "power_of_two"};
  const std::size_t a = rng_() % pool.size();
  std::size_t b = rng_() % (pool.size() - 1);
  if (b >= a) ++b;  // uniform over the others
  const std::size_t first = pool[a], second = pool[b];
  return Decision{less_loaded(replicas[second], replicas[first]) ? second : first, "power_of_two"};
}

}  // namespace kvfleet::router
