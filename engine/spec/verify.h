// Verifying drafts against the target model, exactly.
//
// The rule (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", for a draft that is
// a point mass on token d): at draft position j, with p_j the target's distribution there (the sampler's own:
// temperature, top-k, top-p, min-p, penalties and logit bias applied as without speculation), accept d_j with
// probability p_j(d_j); on rejection emit a token from the residual max(0, p_j - q_j) renormalised, which for a
// point mass q_j is p_j with d_j removed, renormalised; after k accepted drafts emit a bonus token from p_k.
//
// It is carried out by one draw per position: x_j = the sampler's token for row j with the draw the sequence's
// output position gives it (engine/sample: uniform_draw(seed, position)); accept d_j iff x_j == d_j, else emit
// x_j and stop. P(accept) = p_j(d_j), and a rejected x_j is distributed as p_j given x_j != d_j: the residual,
// renormalised. Greedy (temperature 0) is the special case "accept while the argmax equals the draft". Because
// x_j is exactly the token the sequence would have sampled at that position without speculation (same
// distribution, same draw), the output is the same token for token, greedy or seeded, whatever was proposed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::spec {

// `sample_row(j)` returns the target's token at row j (0 <= j <= drafts.size()); row j sees the drafts before
// it as accepted. Appends the emitted tokens to `out`: the accepted drafts, then the first token that differs
// from its draft or, all drafts accepted, the bonus token. Returns the number of accepted drafts.
template <class SampleRow>
std::int32_t accept_drafts(std::span<const TokenId> drafts, SampleRow&& sample_row, std::vector<TokenId>& out) {
  for (std::size_t j = 0;; ++j) {
    const TokenId x = sample_row(j);
    out.push_back(x);
    if (j == drafts.size() || x != drafts[j]) return static_cast<std::int32_t>(j);
  }
}

}  // namespace kvfleet::spec
