#include "router/policies/cache_aware.h"

#include <xxhash.h>

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
  c.kv_usage_weight = knobs.number("kv_usage_weight", c.kv_usage_weight, 0.0, 1e9);
  c.new_prefix_slack = static_cast<std::uint32_t>(knobs.integer("new_prefix_slack", c.new_prefix_slack, 0, 1u << 30));
  c.kv_usage_limit = knobs.number("kv_usage_limit", c.kv_usage_limit, 0.0, 1.0);
  c.rendezvous_blocks = static_cast<std::uint32_t>(knobs.integer("rendezvous_blocks", c.rendezvous_blocks, 1, 1u << 20));
  c.host_tier_weight = knobs.number("host_tier_weight", c.host_tier_weight, 0.0, 1.0);
  c.disk_tier_weight = knobs.number("disk_tier_weight", c.disk_tier_weight, 0.0, 1.0);
  c.shared_tier_weight = knobs.number("shared_tier_weight", c.shared_tier_weight, 0.0, 1.0);
  knobs.finish();
  return std::make_unique<CacheAwarePolicy>(c);
}

double CacheAwarePolicy::weighted_match(const ReplicaState& r) const {
  return r.matched_blocks + config_.host_tier_weight * r.host_blocks + config_.disk_tier_weight * r.disk_blocks +
         config_.shared_tier_weight * r.shared_blocks;
}

Decision CacheAwarePolicy::choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) {
  const std::optional<std::size_t> least = least_loaded(replicas);
  if (!least) return Decision{Decision::kNone, kNoReplica};
  std::uint32_t max_load = 0, min_load = UINT32_MAX;
  for (const ReplicaState& r : replicas) {
    if (!r.available()) continue;
    max_load = std::max(max_load, r.load());
    min_load = std::min(min_load, r.load());
  }
  const bool imbalanced = max_load - min_load > config_.balance_abs_threshold &&
                          static_cast<double>(max_load) > config_.balance_rel_threshold * min_load;
  if (imbalanced) return Decision{*least, "imbalance"};

  std::size_t best = Decision::kNone;
  double best_score = 0;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    const ReplicaState& r = replicas[i];
    const double weighted = weighted_match(r);
    if (!r.available() || weighted <= 0 || request.prompt_blocks == 0) continue;
    const double ratio = std::min<double>(weighted, request.prompt_blocks) / request.prompt_blocks;
    if (ratio < config_.cache_threshold) continue;
    const double usage = r.load_reported ? r.kv_usage : 0.0;
    const double score =
        ratio - config_.load_weight * r.load() / std::max(1u, max_load) - config_.kv_usage_weight * usage;
    const bool better = best == Decision::kNone || score > best_score ||
                        (score == best_score && less_loaded(r, replicas[best]));
    if (better) {
      best = i;
      best_score = score;
    }
  }
  if (best != Decision::kNone) {
    const ReplicaState& r = replicas[best];
    const bool tiers = static_cast<double>(r.matched_blocks) < weighted_match(r);
    return Decision{best, tiers ? "tier_hit" : "cache_hit"};
  }
  if (const std::size_t placed = place_new_prefix(request, replicas, min_load); placed != Decision::kNone)
    return Decision{placed, request.session_key.empty() ? "new_prefix" : "session"};
  return Decision{*least, "no_match"};
}

std::size_t CacheAwarePolicy::place_new_prefix(const RoutingRequest& request, std::span<const ReplicaState> replicas,
                                               std::uint32_t min_load) const {
  std::uint64_t key = 0;
  if (!request.session_key.empty()) {
    key = XXH3_64bits(request.session_key.data(), request.session_key.size());
  } else {
    if (request.block_hashes.empty()) return Decision::kNone;
    key = request.block_hashes[std::min<std::size_t>(config_.rendezvous_blocks, request.block_hashes.size()) - 1];
  }
  std::size_t best = Decision::kNone;
  std::uint64_t best_weight = 0;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    const ReplicaState& r = replicas[i];
    if (!r.available() || r.load() > min_load + config_.new_prefix_slack) continue;
    if (r.load_reported && r.kv_usage > config_.kv_usage_limit) continue;
    const std::uint64_t weight = XXH3_64bits_withSeed(r.id.data(), r.id.size(), key);
    if (best == Decision::kNone || weight > best_weight) {
      best = i;
      best_weight = weight;
    }
  }
  return best;
}

}  // namespace kvfleet::router
