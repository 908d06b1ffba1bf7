// cache_aware (the default policy): send a request where its prompt's KV cache already is, unless
// that would pile work onto one replica.
//
// Algorithm, over the available (healthy, not draining) replicas:
//   1. Load check. With load = requests in flight, the fleet is imbalanced when
//        max_load - min_load > balance_abs_threshold  AND  max_load > balance_rel_threshold * min_load.
//      Both must hold: the absolute gap ignores small fleets at low load (3 vs 1 is not worth a
//      cache miss), the ratio ignores busy fleets whose loads differ by a small fraction. When
//      imbalanced: least loaded replica, reason "imbalance".
//   2. Cache check. match_ratio = matched_blocks / prompt_blocks (0 for a prompt shorter than one
//      block). Replicas with matched_blocks > 0 and match_ratio >= cache_threshold are candidates;
//      each scores
//        score = match_ratio - load_weight * load / max(1, max_load)
//      and the highest score wins (ties: less loaded, then lower index), reason "cache_hit".
//      load_weight 0 means "longest match wins"; a larger one lets a less busy replica with a
//      slightly shorter match win.
//   3. Otherwise: least loaded replica, reason "no_match" (nothing worth reusing).
// "Least loaded" is fewest requests in flight, then fewest tokens in flight, then lowest index.
//
// Knobs (YAML): cache_threshold (0.5, in [0, 1]), balance_abs_threshold (32 requests),
// balance_rel_threshold (1.5, >= 1), load_weight (0.1, >= 0).
#pragma once

#include "router/policy.h"

namespace kvfleet::router {

struct CacheAwareConfig {
  double cache_threshold = 0.5;
  std::uint32_t balance_abs_threshold = 32;
  double balance_rel_threshold = 1.5;
  double load_weight = 0.1;
};

class CacheAwarePolicy final : public Policy {
 public:
  explicit CacheAwarePolicy(CacheAwareConfig config = {}) : config_(config) {}
  static std::unique_ptr<Policy> from_yaml(const YAML::Node& knobs);

  std::string_view name() const override { return "cache_aware"; }
  Decision choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) override;

 private:
  CacheAwareConfig config_;
};

}  // namespace kvfleet::router
