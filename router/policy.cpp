#include "router/policy.h"

#include <stdexcept>
#include <string>

#include "router/policies/cache_aware.h"
#include "router/policies/consistent_hash.h"
#include "router/policies/least_load.h"
#include "router/policies/power_of_two.h"
#include "router/policies/random.h"
#include "router/policies/round_robin.h"

namespace kvfleet::router {

bool less_loaded(const ReplicaState& a, const ReplicaState& b) {
  if (a.load() != b.load()) return a.load() < b.load();
  return a.in_flight_tokens < b.in_flight_tokens;
}

std::optional<std::size_t> least_loaded(std::span<const ReplicaState> replicas) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    if (!replicas[i].available()) continue;
    if (!best || less_loaded(replicas[i], replicas[*best])) best = i;
  }
  return best;
}

namespace {

struct Entry {
  std::string_view name;
  std::unique_ptr<Policy> (*make)(const YAML::Node&);
};

constexpr Entry kPolicies[] = {
    {"cache_aware", &CacheAwarePolicy::from_yaml},   {"round_robin", &RoundRobinPolicy::from_yaml},
    {"least_load", &LeastLoadPolicy::from_yaml},     {"power_of_two", &PowerOfTwoPolicy::from_yaml},
    {"consistent_hash", &ConsistentHashPolicy::from_yaml}, {"random", &RandomPolicy::from_yaml},
};

}  // namespace

std::unique_ptr<Policy> make_policy(std::string_view name, const YAML::Node& knobs) {
  for (const Entry& e : kPolicies) {
    if (e.name == name) return e.make(knobs);
  }
  std::string known;
  for (const Entry& e : kPolicies) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw std::invalid_argument("unknown routing policy '" + std::string(name) + "' (known: " + known + ")");
}

std::unique_ptr<Policy> make_policy(const YAML::Node& config) {
  if (config.IsScalar()) return make_policy(config.Scalar());
  if (!config.IsMap() || !config["name"] || !config["name"].IsScalar()) {
    throw std::invalid_argument("routing policy: expected a name or a map with a 'name' key");
  }
  return make_policy(config["name"].Scalar(), config);
}

}  // namespace kvfleet::router
