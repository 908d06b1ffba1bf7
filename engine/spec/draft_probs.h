// Verifying drafts sampled from a distribution q (a draft model on a sampled request), exactly.
//
// The rule (Leviathan et al.; Chen et al., "Accelerating Large Language Model Decoding with Speculative
// Sampling"): at a draft position, with p the target's distribution and q the draft's, the draft d (drawn from
// q) is accepted with probability min(1, p(d) / q(d)); on rejection the token is drawn from the residual
// max(0, p - q), renormalised. The emitted token is then distributed as p whatever q is. All positions
// accepted: the bonus token is drawn from the target's last row by the ordinary sampler.
//
// Draws: each purpose has its own counter-based stream, indexed by the sequence's output position, so that a
// seeded request is reproducible: draft_draw (the draft model picks d), accept_draw (the acceptance test),
// residual_draw (a rejected position's token). The ordinary sampler's uniform_draw(seed, position) is the
// fourth; the streams never share a value.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"
#include "kvfleet/sampler.h"

namespace kvfleet::spec {

double draft_draw(std::uint64_t seed, std::uint64_t position);
double accept_draw(std::uint64_t seed, std::uint64_t position);
double residual_draw(std::uint64_t seed, std::uint64_t position);

// The distribution sample() draws from for these logits and parameters, as a dense vector (sample_reference's
// definition: temperature, then top-k, top-p and min-p on the sorted candidates, renormalised). Temperature 0:
// a point mass on the argmax (ties: the lowest id). Throws std::invalid_argument when no logit is finite.
void sampling_probs(std::span<const float> logits, const SamplingParams& params, std::vector<float>& out);

// The id where the cumulative sum of `probs` passes u x (their sum): inverse-CDF sampling, u in [0, 1). A u
// that rounds onto the very end picks the last id with any mass.
TokenId draw_from(std::span<const float> probs, double u);

struct Verdict {
  TokenId token = 0;
  bool accepted = false;
};

// One draft position: `draft` accepted iff u_accept x q(draft) < p(draft); otherwise the token drawn with
// u_residual from max(0, p - q) renormalised (from p itself when that residual has no mass, which for exact
// values means p == q and the draft is never rejected).
Verdict accept_or_resample(std::span<const float> p, std::span<const float> q, TokenId draft, double u_accept,
                           double u_residual, std::vector<float>& scratch);

}  // namespace kvfleet::spec
