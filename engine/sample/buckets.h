// sample()'s fast paths (sample/buckets.cpp) and what they share with sampler.cpp. Each picks exactly
// sample_reference()'s token or returns -1 (a draw too close to a boundary to call), and sample() then
// takes a slower exact path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/sample/weights.h"
#include "kvfleet/sampler.h"

namespace kvfleet::sampler_detail {

// Descending by logit, ties by id: the order every filter cuts a prefix of (NaN as -inf).
struct ByLogit {
  std::span<const float> logits;
  bool operator()(TokenId a, TokenId b) const {
    const float la = ordered(logits[static_cast<std::size_t>(a)]), lb = ordered(logits[static_cast<std::size_t>(b)]);
    return la > lb || (la == lb && a < b);
  }
};

[[noreturn]] void no_finite_logit();

// ids sorted as ByLogit sorts them, in O(n) (a radix sort; std::sort below 256 ids).
void radix_sort_desc(std::span<const float> logits, std::vector<TokenId>& ids, std::vector<std::uint32_t>& keys,
                     std::vector<TokenId>& swap);

// Temperature alone (no top-k, top-p or min-p).
TokenId draw_bucketed(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index,
                      SamplerScratch& s);
// top-p without top-k and min-p: sorts the bucket the cut lands in and the one the draw lands in.
TokenId draw_top_p(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index, SamplerScratch& s);
// min-p without top-k and top-p: sorts the buckets around the cut and the one the draw lands in.
TokenId draw_min_p(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index, SamplerScratch& s);
// top-p and/or min-p without top-k: sorts the exact prefix of the reference's order the cuts can reach.
TokenId draw_bucketed_cut(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index,
                          SamplerScratch& s);
// The first k (< logits.size()) ids of the reference's order into s.ids[0, k), without sorting the row:
// bucket counts find the bucket the k-th id is in, and only the ids of that bucket and above are sorted.
// Throws without a finite logit.
void select_top_k(std::span<const float> logits, std::size_t k, SamplerScratch& s);

}  // namespace kvfleet::sampler_detail
