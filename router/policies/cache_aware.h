// cache_aware (the default policy): send a request where its prompt's KV cache already is, unless
// that would pile work onto one replica; place a prefix nobody holds where every router would.
//
// Load. A replica's load is the requests on it: this router's own count of requests in flight, or,
// when the replica reports its own (`load` events on its KV event stream: waiting + running
// sequences, from every router in front of it), the larger of the two (ReplicaState::load()).
//
// Algorithm, over the available (healthy, not draining) replicas:
//   1. Load check (SGLang's). The fleet is imbalanced when
//        max_load - min_load > balance_abs_threshold  AND  max_load > balance_rel_threshold * min_load.
//      Both must hold: the absolute gap ignores small fleets at low load (3 vs 1 is not worth a
//      cache miss), the ratio ignores busy fleets whose loads differ by a small fraction. When
//      imbalanced: least loaded replica, reason "imbalance".
//   2. Cache check. A replica's matched blocks are weighed by where they lie (KV tiers, TierIndex: the
//      leading blocks in its device pool, then those its engine would load from a lower tier, each in the
//      best tier holding it):
//        weighted = device + host_tier_weight * host + disk_tier_weight * disk + shared_tier_weight * shared
//      A shared-tier block counts for every replica that mounts that shared tier. match_ratio =
//      weighted / prompt_blocks (0 for a prompt shorter than one block). Replicas with weighted > 0 and
//      match_ratio >= cache_threshold are candidates;
//      each scores (llm-d-style weighted scorers: prefix, queue, KV usage)
//        score = match_ratio - load_weight * load / max(1, max_load) - kv_usage_weight * kv_usage
//      and the highest score wins (ties: less loaded, then lower index), reason "cache_hit", or
//      "tier_hit" when the winner's match includes lower-tier blocks.
//      load_weight 0 means "longest match wins"; a larger one lets a less busy replica with a
//      slightly shorter match win. A tier weight says how much of a device hit a block in that tier is
//      worth. Loading a returning 4k prompt saves 0.97 (host) and 0.88-0.95 (disk, cold or page cache)
//      of its recompute (docs/benchmarks.md, "KV cache tiers"); the defaults sit below that because a
//      lower tier's marks are less sure (a shared file trimmed by the operator, a disk tier nobody has
//      announced since a reconnect) and a load occupies the replica's I/O threads. Weights 0 route on
//      device blocks only.
//   3. New prefix (no candidate): rendezvous hashing, so that several routers place it alike before
//      any KV event tells them where it went. The key is the prompt's block hash at index
//      min(rendezvous_blocks, prompt_blocks) - 1 (it names the whole prefix up to there, e.g. a shared
//      system prompt); among the replicas whose load <= min_load + new_prefix_slack and whose
//      reported kv_usage <= kv_usage_limit, the highest XXH3(replica id, seed = key) wins, reason
//      "new_prefix". A request with a session key (RoutingRequest::session_key: the router's session
//      header or the body's `user`, router/gateway/router_config.h) is placed the same way with
//      XXH3(session key) as the key, reason "session": every turn of a conversation goes to one
//      replica even when its prompt shares no leading block with the last turn's (a system prompt
//      that carries the time) or the router runs without KV events, and every router agrees. A
//      cache or tier hit above the threshold still wins, and so does the load check. A prompt
//      without a full block and no session key, or no replica passing the filter: least loaded,
//      reason "no_match".
// "Least loaded" is the lowest load, then fewest tokens in flight, then lowest index.
//
// Knobs, in YAML (policy: {name: cache_aware, KNOB: VALUE}) or as flags (--cache-threshold 0.5 ...,
// the knob's name with '-' for '_'; flags win): cache_threshold (0.5, in [0, 1]),
// balance_abs_threshold (32 requests), balance_rel_threshold (1.5, >= 1), load_weight (0.1, >= 0),
// kv_usage_weight (0, >= 0), new_prefix_slack (2 requests), kv_usage_limit (0.95, in [0, 1]),
// rendezvous_blocks (8, >= 1), host_tier_weight (0.9, in [0, 1]), disk_tier_weight (0.7, in [0, 1]),
// shared_tier_weight (0.6, in [0, 1]).
#pragma once

#include "router/policy.h"

namespace kvfleet::router {

struct CacheAwareConfig {
  double cache_threshold = 0.5;
  std::uint32_t balance_abs_threshold = 32;
  double balance_rel_threshold = 1.5;
  double load_weight = 0.1;
  double kv_usage_weight = 0;
  std::uint32_t new_prefix_slack = 2;
  double kv_usage_limit = 0.95;
  std::uint32_t rendezvous_blocks = 8;
  double host_tier_weight = 0.9;
  double disk_tier_weight = 0.7;
  double shared_tier_weight = 0.6;
};

// The knob names (YAML keys) of cache_aware, for the flags that set them.
inline constexpr const char* kCacheAwareKnobs[] = {
    "cache_threshold", "balance_abs_threshold", "balance_rel_threshold", "load_weight",
    "kv_usage_weight", "new_prefix_slack",      "kv_usage_limit",        "rendezvous_blocks",
    "host_tier_weight", "disk_tier_weight",     "shared_tier_weight"};

class CacheAwarePolicy final : public Policy {
 public:
  explicit CacheAwarePolicy(CacheAwareConfig config = {}) : config_(config) {}
  static std::unique_ptr<Policy> from_yaml(const YAML::Node& knobs);

  std::string_view name() const override { return "cache_aware"; }
  Decision choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) override;

 private:
  // Step 3: the rendezvous choice, kNone when it does not apply.
  std::size_t place_new_prefix(const RoutingRequest& request, std::span<const ReplicaState> replicas,
                               std::uint32_t min_load) const;

  // Matched blocks weighed by tier (step 2).
  double weighted_match(const ReplicaState& r) const;

  CacheAwareConfig config_;
};

}  // namespace kvfleet::router
