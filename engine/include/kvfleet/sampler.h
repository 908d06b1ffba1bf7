// Turns a row of logits into the next token. Deterministic: the random draw for a sequence's n-th generated
// token depends only on (seed, n), never on the batch or the thread, so batched, chunked and preempted runs
// reproduce the same output as a sequence run alone.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  std::int32_t top_k = 0;    // 0 or -1: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  std::uint64_t seed = 0;

  // Throws std::invalid_argument naming the field when a value is out of range.
  void validate() const;
};

// Greedy when temperature == 0 (ties go to the lowest id); otherwise temperature, then top-k, top-p and
// min-p filtering on the sorted distribution, then an inverse-CDF draw with a counter-based random number.
TokenId sample(std::span<const float> logits, const SamplingParams& params, std::uint64_t draw_index);

struct Penalties {
  float presence = 0.0f;    // OpenAI: subtracted once from every token that appeared in the output
  float frequency = 0.0f;   // OpenAI: subtracted per occurrence in the output
  float repetition = 1.0f;  // HF/vLLM: logits of tokens seen in prompt or output divided (if > 0) or multiplied
  bool active() const { return presence != 0.0f || frequency != 0.0f || repetition != 1.0f; }
};

// Applies the penalties in place (vLLM's order: repetition, then frequency and presence).
void apply_penalties(std::span<float> logits, const Penalties& p, std::span<const TokenId> prompt,
                     std::span<const TokenId> output);

struct TokenLogprob {
  TokenId id = 0;
  float logprob = 0.0f;
};

// log_softmax(logits)[chosen] and the `top` most likely tokens (descending, ties by id), computed from the
// model's logits before any sampling transform, as vLLM reports them.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, TokenId chosen, int top, float* chosen_logprob);

// The uniform number in [0, 1) for (seed, index): splitmix64 over the pair.
double uniform_draw(std::uint64_t seed, std::uint64_t index);

}  // namespace kvfleet
