#include "kvfleet/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/sample/buckets.h"
#include "engine/sample/scan.h"
#include "engine/sample/weights.h"
#include "kernels/uniform_draw.h"

namespace kvfleet {

void SamplingParams::validate() const {
  auto bad = [](const char* field, const std::string& why) {
    throw std::invalid_argument(std::string(field) + " " + why);
  };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) bad("temperature", "must be a finite number >= 0");
  if (top_k < -1) bad("top_k", "must be -1, 0 (off) or positive");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p", "must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", "must be in [0, 1]");
}

double uniform_draw(std::uint64_t seed, std::uint64_t index) { return kernels::uniform_draw(seed, index); }

namespace {

using sampler_detail::ByLogit;
using sampler_detail::no_finite_logit;
using sampler_detail::ordered;
using sampler_detail::weight;

// The lowest id of the largest logit: a vectorised max, then a vectorised search for it (-0 == +0).
TokenId greedy(std::span<const float> logits) {
  const float max_l = sampler_detail::row_range(logits).max;
  if (!std::isfinite(max_l)) no_finite_logit();
  return static_cast<TokenId>(sampler_detail::first_equal(logits, max_l));
}

}  // namespace

namespace sampler_detail {
void no_finite_logit() { throw std::invalid_argument("sample: the logits hold no finite maximum"); }
}  // namespace sampler_detail

TokenId sample_reference(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index) {
  if (logits.empty()) throw std::invalid_argument("sample: empty logits");
  if (p.temperature == 0.0f) return greedy(logits);

  // Candidates sorted by logit (descending, ties by id) so every filter below is a prefix cut.
  std::vector<TokenId> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const ByLogit by_logit{logits};
  std::size_t keep = ids.size();
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < keep) {
    keep = static_cast<std::size_t>(p.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end(), by_logit);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  // Softmax of logits / temperature over the kept candidates: float weights (sample/weights.h), summed
  // and normalised in double, left to right in sorted order.
  const float max_l = ordered(logits[static_cast<std::size_t>(ids[0])]);
  if (!std::isfinite(max_l)) no_finite_logit();
  std::vector<double> probs(keep);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i)
    total += probs[i] = weight(logits[static_cast<std::size_t>(ids[i])], max_l, p.temperature);
  for (auto& x : probs) x /= total;
  if (p.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double cum = 0.0;
    std::size_t n = 0;
    while (n < keep && cum < p.top_p) cum += probs[n++];
    keep = std::max<std::size_t>(n, 1);
  }
  if (p.min_p > 0.0f) {  // drop tokens less likely than min_p times the most likely one
    std::size_t n = 1;
    while (n < keep && probs[n] >= p.min_p * probs[0]) ++n;
    keep = n;
  }
  double mass = 0.0;
  for (std::size_t i = 0; i < keep; ++i) mass += probs[i];
  const double target = uniform_draw(p.seed, draw_index) * mass;
  double cum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (target < cum) return ids[i];
  }
  // The draw rounded onto the very end of the mass: the last kept id that has any. The ids after it weigh
  // nothing (a -inf logit: masked by a grammar, unshowable) and must never be drawn.
  while (keep > 1 && !(probs[keep - 1] > 0.0)) --keep;
  return ids[keep - 1];
}

namespace sampler_detail {

// ids (ascending) sorted by logit descending, ties by id: a stable LSD radix sort on a 32-bit key whose
// unsigned order is the reverse of ByLogit's float order (NaN as -inf, -0 as +0), 4 passes of 8 bits.
// The same order as std::sort with ByLogit, in O(n).
void radix_sort_desc(std::span<const float> logits, std::vector<TokenId>& ids, std::vector<std::uint32_t>& keys,
                     std::vector<TokenId>& swap) {
  const std::size_t n = ids.size();
  if (n < 256) {
    std::sort(ids.begin(), ids.end(), ByLogit{logits});
    return;
  }
  keys.resize(2 * n);
  swap.resize(n);
  std::uint32_t* key = keys.data();
  std::uint32_t* key_swap = keys.data() + n;
  for (std::size_t i = 0; i < n; ++i) {
    float l = ordered(logits[static_cast<std::size_t>(ids[i])]);
    if (l == 0.0f) l = 0.0f;  // -0 sorts with +0, as the comparator has it
    const auto u = std::bit_cast<std::uint32_t>(l);
    const std::uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    key[i] = ~asc;
  }
  TokenId* a = ids.data();
  TokenId* b = swap.data();
  for (int shift = 0; shift < 32; shift += 8) {
    std::size_t count[257] = {};
    for (std::size_t i = 0; i < n; ++i) ++count[((key[i] >> shift) & 0xffu) + 1];
    if (count[1 + ((key[0] >> shift) & 0xffu)] == n) continue;  // one bucket: nothing moves
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t at = count[(key[i] >> shift) & 0xffu]++;
      b[at] = a[i];
      key_swap[at] = key[i];
    }
    std::swap(a, b);
    std::swap(key, key_swap);
  }
  if (a != ids.data()) std::copy(a, a + n, ids.data());
}

}  // namespace sampler_detail

namespace {
using sampler_detail::radix_sort_desc;

// The head of the distribution: every token whose weight exp((l - max) / T) is at least e^-46 (below it,
// under 2^-64, a weight cannot change a double sum that is >= 1 (the max's own weight), nor a cumulative
// probability that is >= the max's: the tail is exactly invisible to the sums below).
// Leaves scratch.ids holding the head sorted as the reference sorts everything (descending logit, ties by
// id) and returns its size. Not for top-k (select_top_k).
std::size_t sorted_head(std::span<const float> logits, const SamplingParams& p, SamplerScratch& s) {
  std::vector<TokenId>& ids = s.ids;
  float max_l = -std::numeric_limits<float>::infinity();
  for (float l : logits) max_l = std::max(max_l, ordered(l));
  ids.clear();
  if (!std::isfinite(max_l)) {  // no finite logit: the caller throws on ids[0]
    ids.push_back(0);
    return 1;
  }
  const double cut = static_cast<double>(max_l) - 46.0 * static_cast<double>(p.temperature);
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (static_cast<double>(ordered(logits[i])) >= cut) ids.push_back(static_cast<TokenId>(i));
  radix_sort_desc(logits, ids, s.keys, s.swap);
  return ids.size();
}

// The reference's softmax, top-p, min-p and inverse-CDF draw over the sorted head; -1 where the answer
// would depend on the tail's order (a cut or the draw running past the head), which the caller then
// leaves to the reference.
TokenId draw_from_head(std::span<const float> logits, float max_l, const SamplingParams& p, std::uint64_t draw_index,
                       SamplerScratch& s, std::size_t head) {
  const std::size_t full = p.top_k > 0 && static_cast<std::size_t>(p.top_k) < logits.size()
                               ? static_cast<std::size_t>(p.top_k) : logits.size();
  std::size_t keep = std::min(full, head);
  bool tail = full > head;  // kept candidates beyond the head (weights too small to count)
  const std::vector<TokenId>& ids = s.ids;
  std::vector<double>& probs = s.probs;
  probs.resize(keep);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i) total += probs[i] = weight(logits[static_cast<std::size_t>(ids[i])], max_l, p.temperature);
  for (std::size_t i = 0; i < keep; ++i) probs[i] /= total;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    std::size_t n = 0;
    while (n < keep && cum < p.top_p) cum += probs[n++];
    if (n == keep && cum < p.top_p && tail) return -1;
    keep = std::max<std::size_t>(n, 1);
    tail = false;
  }
  if (p.min_p > 0.0f) {
    std::size_t n = 1;
    while (n < keep && probs[n] >= p.min_p * probs[0]) ++n;
    if (n == keep && tail) return -1;
    keep = n;
    tail = false;
  }
  double mass = 0.0;
  for (std::size_t i = 0; i < keep; ++i) mass += probs[i];
  const double target = uniform_draw(p.seed, draw_index) * mass;
  double cum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (target < cum) return ids[i];
  }
  if (tail) return -1;
  while (keep > 1 && !(probs[keep - 1] > 0.0)) --keep;  // as the reference: never an id that weighs nothing
  return ids[keep - 1];
}

bool temperature_only(const SamplingParams& p, std::size_t vocab) {
  return !(p.top_k > 0 && static_cast<std::size_t>(p.top_k) < vocab) && p.top_p >= 1.0f && p.min_p <= 0.0f;
}

}  // namespace

TokenId sample(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index) {
  SamplerScratch scratch;
  return sample(logits, p, draw_index, scratch);
}

TokenId sample(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index,
               SamplerScratch& scratch) {
  using namespace sampler_detail;
  if (logits.empty()) throw std::invalid_argument("sample: empty logits");
  if (p.temperature == 0.0f) return greedy(logits);
  if (temperature_only(p, logits.size())) {
    if (const TokenId t = draw_bucketed(logits, p, draw_index, scratch); t >= 0) return t;
    return sample_reference(logits, p, draw_index);
  }
  std::size_t head = 0;
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < logits.size()) {
    // The reference's first k ids, then its own math over them: the same token, no fallback needed.
    head = static_cast<std::size_t>(p.top_k);
    select_top_k(logits, head, scratch);
  } else {
    // top-p alone on a row too small for buckets to pay goes to the prefix path.
    if (p.min_p <= 0.0f && logits.size() >= 256)
      if (const TokenId t = draw_top_p(logits, p, draw_index, scratch); t >= 0) return t;
    // min-p alone likewise (on a flat row its kept prefix is most of the vocabulary: too long to sort).
    if (p.top_p >= 1.0f && logits.size() >= 256)
      if (const TokenId t = draw_min_p(logits, p, draw_index, scratch); t >= 0) return t;
    if (const TokenId t = draw_bucketed_cut(logits, p, draw_index, scratch); t >= 0) return t;
    head = sorted_head(logits, p, scratch);
  }
  const float max_l = ordered(logits[static_cast<std::size_t>(scratch.ids[0])]);
  if (!std::isfinite(max_l)) no_finite_logit();
  if (const TokenId t = draw_from_head(logits, max_l, p, draw_index, scratch, head); t >= 0) return t;
  return sample_reference(logits, p, draw_index);
}

void apply_penalties(std::span<float> logits, const Penalties& p, std::span<const TokenId> prompt,
                     std::span<const TokenId> output) {
  const auto vocab = static_cast<TokenId>(logits.size());
  if (p.repetition != 1.0f) {
    std::vector<bool> seen(logits.size(), false);
    for (auto ids : {prompt, output})
      for (TokenId t : ids)
        if (t >= 0 && t < vocab) seen[static_cast<std::size_t>(t)] = true;
    for (std::size_t i = 0; i < logits.size(); ++i)
      if (seen[i]) logits[i] = logits[i] > 0 ? logits[i] / p.repetition : logits[i] * p.repetition;
  }
  if (p.frequency != 0.0f || p.presence != 0.0f) {
    std::vector<std::int32_t> count(logits.size(), 0);
    for (TokenId t : output)
      if (t >= 0 && t < vocab) ++count[static_cast<std::size_t>(t)];
    for (std::size_t i = 0; i < logits.size(); ++i)
      if (count[i] > 0) logits[i] -= p.frequency * static_cast<float>(count[i]) + p.presence;
  }
}

void PenaltyState::observe(std::span<const TokenId> prompt, std::span<const TokenId> output) {
  auto add = [&](TokenId t, std::int32_t n) {
    auto [it, fresh] = index_.try_emplace(t, static_cast<std::uint32_t>(distinct_.size()));
    if (fresh) {
      distinct_.push_back(t);
      count_.push_back(0);
    }
    count_[it->second] += n;
  };
  if (!has_prompt_) {
    for (TokenId t : prompt) add(t, 0);
    has_prompt_ = true;
  }
  if (output.size() < outputs_seen_) {  // not a continuation of what was seen: start over
    *this = {};
    observe(prompt, output);
    return;
  }
  for (std::size_t i = outputs_seen_; i < output.size(); ++i) add(output[i], 1);
  outputs_seen_ = output.size();
}

void PenaltyState::apply(std::span<float> logits, const Penalties& p) const {
  const auto vocab = static_cast<TokenId>(logits.size());
  if (p.repetition != 1.0f) {
    for (TokenId t : distinct_) {
      if (t < 0 || t >= vocab) continue;
      float& l = logits[static_cast<std::size_t>(t)];
      l = l > 0 ? l / p.repetition : l * p.repetition;
    }
  }
  if (p.frequency != 0.0f || p.presence != 0.0f) {
    for (std::size_t i = 0; i < distinct_.size(); ++i) {
      const TokenId t = distinct_[i];
      const std::int32_t n = count_[i];
      if (n > 0 && t >= 0 && t < vocab) logits[static_cast<std::size_t>(t)] -= p.frequency * static_cast<float>(n) + p.presence;
    }
  }
}

// log sum exp(l), with the sampler's float weights (sample/weights.h: relative error under 2e-7 per term, far
// below a float logprob's own rounding once max_l is added back) summed in double over 8 fixed lanes, combined
// in a fixed order: no libm call per entry, and the same value whatever the batch or the thread.
double log_normalizer(std::span<const float> logits) {
  const float max_l = sampler_detail::row_range(logits).max;
  if (!std::isfinite(max_l)) no_finite_logit();
  constexpr std::size_t kLanes = 8;
  double lane[kLanes] = {};
  const std::size_t n = logits.size(), whole = n - n % kLanes;
  for (std::size_t i = 0; i < whole; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) lane[j] += sampler_detail::exp_weight(ordered(logits[i + j]) - max_l);
  for (std::size_t i = whole; i < n; ++i) lane[i - whole] += sampler_detail::exp_weight(ordered(logits[i]) - max_l);
  const double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  return max_l + std::log(sum);
}

void top_alternatives(std::span<const float> logits, int top, double log_z, SamplerScratch& scratch,
                      std::vector<TokenLogprob>& out) {
  out.clear();
  if (top <= 0) return;
  std::vector<TokenId>& ids = scratch.ids;
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(top), logits.size());
  if (k < logits.size()) {
    sampler_detail::select_top_k(logits, k, scratch);
  } else {
    ids.resize(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), ByLogit{logits});
  }
  for (std::size_t i = 0; i < k; ++i)
    out.push_back({ids[i], static_cast<float>(logits[static_cast<std::size_t>(ids[i])] - log_z)});
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, TokenId chosen, int top, float* chosen_logprob) {
  const double log_z = log_normalizer(logits);
  if (chosen_logprob) *chosen_logprob = static_cast<float>(ordered(logits[static_cast<std::size_t>(chosen)]) - log_z);
  std::vector<TokenLogprob> out;
  SamplerScratch scratch;
  top_alternatives(logits, top, log_z, scratch, out);
  return out;
}

}  // namespace kvfleet
