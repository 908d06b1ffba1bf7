#include "router/gateway/pd_routing.h"

#include "router/gateway/gateway.h"

namespace kvfleet::router {

PdChoice choose_prefill(std::uint64_t uncached_tokens, std::uint64_t threshold, std::span<const PrefillCandidate> pool) {
  PdChoice out;
  if (uncached_tokens <= threshold) return out;
  const PrefillCandidate* best = nullptr;
  for (const PrefillCandidate& c : pool) {
    if (!c.available) continue;
    if (!best || c.matched_blocks > best->matched_blocks ||
        (c.matched_blocks == best->matched_blocks && c.in_flight < best->in_flight))
      best = &c;
  }
  if (!best) {
    out.reason = "no_prefill_replica";
    return out;
  }
  out.prefill = best->index;
  out.reason = "disaggregated";
  return out;
}

}  // namespace kvfleet::router

// Gateway's side, kept here: the prefill pool's states under the routing mutex.

namespace kvfleet::router {

const char* Gateway::choose_prefill_locked(RoutePlan& plan, const ReplicaLink& decode, std::uint32_t matched, Tick now) {
  plan.prefill_from.clear();
  // pd mode when either pool is configured: with decode replicas beside mixed ones (and no dedicated
  // prefill replica) the mixed replicas are the prefill pool.
  if (config_.prefill_replicas.empty() && config_.decode_replicas.empty()) return nullptr;
  const MatchResult match = index_.match(plan.hashes);
  std::vector<PrefillCandidate> pool;
  for (std::size_t i = 0; i < links_.size(); ++i) {
    ReplicaLink& l = *links_[i];
    if (l.pd_pool == ReplicaPool::decode || &l == &decode) continue;
    pool.push_back({i, l.healthy && !l.draining && l.breaker.available(now), match.of(l.slot), l.in_flight});
  }
  const std::uint64_t held = std::uint64_t{matched} * config_.block_size;
  const std::uint64_t uncached = plan.prompt_tokens > held ? plan.prompt_tokens - held : 0;
  const PdChoice choice = choose_prefill(uncached, config_.pd_threshold, pool);
  if (choice.prefill) {
    ReplicaLink& p = *links_[*choice.prefill];
    plan.prefill_from = p.url;
    p.in_flight += 1;  // until release(): the prefill replica works for this request too
  }
  return choice.reason;
}

}  // namespace kvfleet::router
