// Turns a row of logits into the next token. Deterministic: the random draw for a sequence's n-th generated
// token depends only on (seed, n), never on the batch or the thread, so batched, chunked and preempted runs
// reproduce the same output as a sequence run alone.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
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
// The weights exp((l - max) / T) are floats from a vectorised polynomial (engine/sample/weights.h,
// relative error < 2e-7), summed in double. Picks the same token as sorting the whole vocabulary would (the
// reference below), without sorting it: the ids fall into buckets by weight, which keep the sorted order,
// and only the bucket a cut or the draw lands in is sorted (temperature alone and top-p: one or two
// buckets; top-k: the buckets down to the k-th id; min-p alone: the buckets around its cut and the
// draw's; top-p with min-p: the head above the cuts); a draw too close to call
// falls back to the reference. The row passes use AVX-512 where the CPU has it (engine/sample/scan.h).
TokenId sample(std::span<const float> logits, const SamplingParams& params, std::uint64_t draw_index);

// Constrained decoding: every id the bitmask (kvfleet/token_constraint.h's layout) does not allow gets the
// logit -inf, ids past the mask's end included. Returns whether some allowed id kept a finite logit (false:
// nothing can be sampled). -inf is a fixed point of logit_bias and the penalties, so masking before or after
// them samples the same token; sample() never returns an id whose logit is -inf.
bool apply_token_mask(std::span<float> logits, std::span<const std::uint32_t> mask);

// Buffers sample() reuses from call to call (one per engine thread): no vocabulary-sized allocation per token.
struct SamplerScratch {
  std::vector<TokenId> ids, swap;
  std::vector<std::uint32_t> keys;
  std::vector<double> probs;
  // Temperature alone: every id's weight and bucket, each bucket's weight sum.
  std::vector<float> weights;
  std::vector<std::uint16_t> bucket;
  std::vector<double> bucket_sum;
  std::vector<std::uint32_t> bucket_count;  // top-k: each bucket's number of ids
  // Optional: the row (as many floats as this one) the caller samples next with this scratch; the weight
  // pass prefetches it, so that its first pass does not wait on memory. A hint only: never read for values.
  const float* next_row = nullptr;
};
TokenId sample(std::span<const float> logits, const SamplingParams& params, std::uint64_t draw_index,
               SamplerScratch& scratch);
// The definition sample() keeps to: sort every id, softmax, cut, draw. For tests.
TokenId sample_reference(std::span<const float> logits, const SamplingParams& params, std::uint64_t draw_index);

struct Penalties {
  float presence = 0.0f;    // OpenAI: subtracted once from every token that appeared in the output
  float frequency = 0.0f;   // OpenAI: subtracted per occurrence in the output
  float repetition = 1.0f;  // HF/vLLM: logits of tokens seen in prompt or output divided (if > 0) or multiplied
  bool active() const { return presence != 0.0f || frequency != 0.0f || repetition != 1.0f; }
};

// Applies the penalties in place (vLLM's order: repetition, then frequency and presence). Rescans prompt and
// output: the reference PenaltyState is tested against.
void apply_penalties(std::span<float> logits, const Penalties& p, std::span<const TokenId> prompt,
                     std::span<const TokenId> output);

// The same penalties for one request, its counts kept up to date as its output grows: observe() reads only
// the tokens it has not seen yet, apply() touches only the distinct ids seen, so a token costs O(new tokens
// + distinct ids) instead of O(vocabulary + prompt + output). Gives the same logits as apply_penalties.
class PenaltyState {
 public:
  // `output` is the request's whole output so far; only its new tail is read.
  void observe(std::span<const TokenId> prompt, std::span<const TokenId> output);
  void apply(std::span<float> logits, const Penalties& p) const;
  // Every id apply() may change (those of prompt and output, each once).
  std::span<const TokenId> ids() const { return distinct_; }

 private:
  bool has_prompt_ = false;
  std::size_t outputs_seen_ = 0;
  // Each new token costs one hash lookup (observe); apply() walks the two arrays, no lookup per id.
  std::vector<TokenId> distinct_;                    // ids of prompt and output, each once
  std::vector<std::int32_t> count_;                  // [i]: distinct_[i]'s count in the output
  std::unordered_map<TokenId, std::uint32_t> index_;  // id -> its index in distinct_
};

struct TokenLogprob {
  TokenId id = 0;
  float logprob = 0.0f;
};

// log_softmax(logits)[chosen] and the `top` most likely tokens (descending, ties by id), computed from the
// model's logits before any sampling transform, as vLLM reports them.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, TokenId chosen, int top, float* chosen_logprob);
// The same in two halves, for a caller that changes the logits (bias, penalties) before it knows the chosen
// token, without keeping a copy of them: log Z of the raw logits, and their `top` alternatives into `out`
// (scratch reused: no vocabulary-sized allocation). The chosen token's logprob is then raw[chosen] - log Z.
double log_normalizer(std::span<const float> logits);
void top_alternatives(std::span<const float> logits, int top, double log_z, SamplerScratch& scratch,
                      std::vector<TokenLogprob>& out);

// The uniform number in [0, 1) for (seed, index): splitmix64 over the pair.
double uniform_draw(std::uint64_t seed, std::uint64_t index);

}  // namespace kvfleet
