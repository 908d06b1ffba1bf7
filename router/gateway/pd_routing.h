// Router `pd` mode (docs/architecture.md, Contract 3): which prefill replica, if any, computes a request's prompt.
//
// The decode replica D is chosen first, by the configured policy among the decode pool (decode and
// mixed replicas), so its cache counts. Then, only when the part of the prompt D does not hold
// (prompt tokens - D's matched blocks * block size) exceeds `pd_threshold` tokens (llm-d's decider;
// Dynamo's max_local_prefill_length), a prefill replica P is picked among the prefill pool (prefill and
// mixed replicas, D itself excluded): the most matched blocks first (its prefix cache shortens P's
// prefill), then the fewest requests in flight, then the lowest slot. The request goes to D with
// `x-kvfleet-prefill-from: P`; otherwise D prefills locally. Reasons, counted in
// kvfleet_router_pd_decisions_total{reason}: disaggregated, below_threshold, no_prefill_replica.
// pd mode is on when either pool is configured: decode replicas beside mixed ones (no dedicated prefill
// replica) make the mixed replicas the prefill pool.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace kvfleet::router {

enum class ReplicaPool { mixed, prefill, decode };  // mixed replicas serve in both pools

struct PrefillCandidate {
  std::size_t index = 0;  // the caller's own numbering
  bool available = false;  // healthy, not draining, breaker closed, not D
  std::uint32_t matched_blocks = 0;
  std::uint32_t in_flight = 0;
};

struct PdChoice {
  std::optional<std::size_t> prefill;  // the candidate's index, when disaggregated
  const char* reason = "below_threshold";
};

PdChoice choose_prefill(std::uint64_t uncached_tokens, std::uint64_t threshold, std::span<const PrefillCandidate> pool);

}  // namespace kvfleet::router
