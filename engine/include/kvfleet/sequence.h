// Sequence: one request's state as the scheduler and the KV cache manager see it. Plain data.
//
// tokens = prompt followed by the outputs sampled so far. Positions [0, num_computed_tokens) have
// their K/V in the blocks of block_table; a running sequence in decode has exactly one token (the
// last sampled) not yet computed. Preemption (by recompute) frees the blocks and resets
// num_computed_tokens to 0: prompt + outputs so far are then computed again, which makes the
// resumed sequence sample exactly what it would have sampled without the interruption.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"
#include "kvfleet/block_pool.h"
#include "kvfleet/kv_tier_config.h"

namespace kvfleet {

using SeqId = std::uint64_t;

enum class SeqStatus : std::uint8_t { waiting, running, preempted, finished };
// Why a sequence finished; the engine decides stop/length, the scheduler records aborts.
enum class FinishReason : std::uint8_t { none, stop, length, aborted };

const char* to_string(SeqStatus status);
const char* to_string(FinishReason reason);

// What Scheduler::add needs to know about a new request.
struct SequenceParams {
  SeqId id = 0;  // 0: the scheduler numbers it; else the caller's id (the engine's request id), unique
  std::vector<TokenId> prompt;
  std::vector<TokenId> outputs;   // a resumed request's outputs so far (GenerationRequest::resumed_outputs)
  std::int32_t priority = 0;      // lower runs first when the scheduler uses priorities
  BlockHash hash_root = 0;        // block_hash_root(model, cache salt) of a salted request; 0: the cache's
};

struct Sequence {
  SeqId id = 0;
  std::uint64_t arrival = 0;  // order of Scheduler::add calls, ties broken by nothing else
  std::int32_t priority = 0;
  BlockHash hash_root = 0;  // the namespace of its block hashes (Contract 1); 0: the KV cache's own root
  SeqStatus status = SeqStatus::waiting;
  FinishReason finish_reason = FinishReason::none;
  std::int32_t num_preemptions = 0;

  std::vector<TokenId> tokens;
  std::int32_t num_prompt_tokens = 0;
  std::int32_t num_computed_tokens = 0;
  std::vector<BlockId> block_table;

  // KV bookkeeping, owned by KvCacheManager: hashes of the full blocks of `tokens` computed so far
  // (tokens are only ever appended, so these stay valid, even across preemption), and how many
  // leading blocks of block_table are known to the prefix cache (hit or committed).
  std::vector<BlockHash> block_hashes;
  std::int32_t num_cached_blocks = 0;

  // Set while a lower KV tier (engine/kvtier) loads blocks of its prefix: admission passes over it (the
  // sequences behind it may go first) until the blocks are in the device pool.
  bool kv_loading = false;
  // The lower tiers' blocks of its prefix landed for it, in order (engine/kvtier).
  std::vector<KvTierLoad> tier_loads;

  // Speculative decoding (engine/spec): during a step that verifies drafts, the last token followed by the
  // drafts, the chunk the scheduler hands out. Not part of `tokens` until accepted.
  std::vector<TokenId> verify_tokens;

  std::int32_t num_tokens() const { return static_cast<std::int32_t>(tokens.size()); }
  std::int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const TokenId> prompt() const { return std::span(tokens).first(num_prompt_tokens); }
  std::span<const TokenId> outputs() const { return std::span(tokens).subspan(num_prompt_tokens); }
  // Tokens known but whose K/V are not computed yet.
  std::int32_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }
  bool is_finished() const { return status == SeqStatus::finished; }
};

}  // namespace kvfleet
