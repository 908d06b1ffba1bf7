#include "router/policies/cache_aware.h"

#include <algorithm>

#include "router/policy_knobs.h"

namespace kvfleet::router {

std::unique_ptr<Policy> CacheAwarePolicy::from_yaml(const YAML::Node& node) {
  Knobs knobs("cache_aware", node);
  CacheAwareConfig c;
  c.cache_threshold = knobs.number("cache_threshold", c.cache_threshold, 0.0, 1.0);
  c.balance_abs_threshold = static_cast<std::uint32_t>(
      knobs.integer("balance_abs_threshold", c.balance_abs_threshold, 0, 1u << 30));
  c.balance_rel_threshold = knobs.number("balance_rel_threshold", c.balance_rel_threshold, 1.0, 1e9);
  c.load_weight = knobs.number("load_weight", c.load_weight, 0.0, 1e9);
  knobs.finish();
  return std::make_unique<CacheAwarePolicy>(c);
}

Decision CacheAwarePolicy::choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) {
  const std::optional<std::size_t> least = least_loaded(replicas);
  if (!least) return Decision{Decision::kNone, kNoReplica};
  std::uint32_t max_load = 0, min_load = UINT32_MAX;
  for (const ReplicaState& r : replicas) {
    if (!r.available()) continue;
    max_load = std::max(max_load, r.in_flight_requests);
    min_load = std::min(min_load, r.in_flight_requests);
  }
  const bool imbalanced = max_load - min_load > config_.balance_abs_threshold &&
                          static_cast<double>(max_load) > config_.balance_rel_threshold * min_load;
  if (imbalanced) return Decision{*least, "imbalance"};

  std::size_t best = Decision::kNone;
  double best_score = 0;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    const ReplicaState& r = replicas[i];
    if (!r.available() || r.matched_blocks == 0 || request.prompt_blocks == 0) continue;
    const double ratio = static_cast<double>(std::min(r.matched_blocks, request.prompt_blocks)) / request.prompt_blocks;
    if (ratio < config_.cache_threshold) continue;
    const double score = ratio - config_.load_weight * r.in_flight_requests / std::max(1u, max_load);
    const bool better = best == Decision::kNone || score > best_score ||
                        (score == best_score && less_loaded(r, replicas[best]));
    if (better) {
      best = i;
      best_score = score;
    }
  }
  if (best != Decision::kNone) return Decision{best, "cache_hit"};
  return Decision{*least, "no_match"};
}

}  // namespace kvfleet::router
