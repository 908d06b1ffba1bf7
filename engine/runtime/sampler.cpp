#include "kvfleet/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/runtime/sampler_weights.h"
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

// NaN compares as -inf (sampler_weights.h), so that every ordering below is a strict weak ordering
// (std::sort's comparator with NaN is undefined behaviour) and a NaN is never chosen over a number.
using sampler_detail::ordered;
using sampler_detail::weight;

// Descending by logit, ties by id: the order every filter below cuts a prefix of.
struct ByLogit {
  std::span<const float> logits;
  bool operator()(TokenId a, TokenId b) const {
    const float la = ordered(logits[static_cast<std::size_t>(a)]), lb = ordered(logits[static_cast<std::size_t>(b)]);
    return la > lb || (la == lb && a < b);
  }
};

[[noreturn]] void no_finite_logit() { throw std::invalid_argument("sample: the logits hold no finite maximum"); }

// The largest and the smallest ordered logit (NaN as -inf), as an integer max and min over keys whose signed
// order is the floats' order: the compiler vectorises those, not a float max (its NaN and -0 rules).
struct Range {
  float max, min;
};
Range row_range(std::span<const float> logits) {
  constexpr std::int32_t kPosInf = 0x7f800000, kNegInf = static_cast<std::int32_t>(0x807fffff);  // keys of +-inf
  std::int32_t hi = kNegInf, lo = kPosInf;
  for (float l : logits) {
    const auto u = std::bit_cast<std::int32_t>(l);
    std::int32_t key = u ^ ((u >> 31) & 0x7fffffff);  // negative floats: magnitude bits flipped
    key = key > kPosInf || key < kNegInf ? kNegInf : key;  // NaN of either sign
    hi = key > hi ? key : hi;
    lo = key < lo ? key : lo;
  }
  auto to_float = [](std::int32_t k) { return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff)); };
  return {to_float(hi), to_float(lo)};
}

// The lowest id of the largest logit: a vectorised max, then the first id that has it (-0 == +0).
TokenId greedy(std::span<const float> logits) {
  const float max_l = row_range(logits).max;
  if (!std::isfinite(max_l)) no_finite_logit();
  std::size_t best = 0;
  while (logits[best] != max_l) ++best;
  return static_cast<TokenId>(best);
}

}  // namespace

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
  // Softmax of logits / temperature over the kept candidates: float weights (sampler_weights.h), summed
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
  return ids[keep - 1];
}

namespace {

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

// The head of the distribution: every token whose weight exp((l - max) / T) is at least e^-46 (below it,
// under 2^-64, a weight cannot change a double sum that is >= 1 (the max's own weight), nor a cumulative
// probability that is >= the max's: the tail is exactly invisible to the sums below).
// Leaves scratch.ids holding the head sorted as the reference sorts everything (descending logit, ties by
// id) and returns its size; with top_k, the first top_k of the whole vocabulary as the reference has them.
std::size_t sorted_head(std::span<const float> logits, const SamplingParams& p, SamplerScratch& s) {
  std::vector<TokenId>& ids = s.ids;
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < logits.size()) {  // top-k: a k-heap over everything
    ids.resize(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + p.top_k, ids.end(), ByLogit{logits});
    return logits.size();
  }
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
  return tail ? -1 : ids[keep - 1];
}

constexpr int kBuckets = 1024;  // over the row's x = (l - max) / T, at most [-88, 0]

// Temperature alone (no top-k, top-p or min-p): the reference's draw (the first id, in sorted order, whose
// cumulative probability passes u * mass) without sorting the vocabulary. The ids fall into buckets by x,
// which keep the sorted order between buckets; the walk over the buckets' weight sums finds the one the
// draw lands in, and only that bucket is sorted. Sums in another order than the reference's differ from
// its sums by at most (n + 2) ulp of the total each (positive terms), so a draw farther than 4 (n + 4) ulp
// from every boundary it is compared with picks the reference's token; a nearer one (a chance of order
// n^2 2^-53) returns -1 and the caller leaves it to the reference.
// Every id's weight (the reference's, sampler_weights.h) and bucket, and each bucket's weight sum; returns
// the row's largest logit (throws without a finite one). Bucket b holds x in (-(b + 1), -b] * span / kBuckets:
// monotone in x (so in the sorted order) whatever the rounding. Returns the bucket width in x through `width_x`.
float bucket_row(std::span<const float> logits, float t, SamplerScratch& s, float* width_x = nullptr) {
  const std::size_t n = logits.size();
  const Range range = row_range(logits);
  const float max_l = range.max;
  if (!std::isfinite(max_l)) no_finite_logit();
  s.weights.resize(n);
  s.bucket.resize(n);
  float* w = s.weights.data();
  std::uint16_t* bucket = s.bucket.data();
  const float width = std::min(88.0f, (max_l - range.min) / t);
  const float span = width > 0.0f ? width : 1.0f, to_bucket = static_cast<float>(kBuckets) / span;
  if (width_x) *width_x = span / static_cast<float>(kBuckets);
  for (std::size_t i = 0; i < n; ++i) {  // vectorised: no call, no branch
    const float x = (ordered(logits[i]) - max_l) / t;
    w[i] = sampler_detail::exp_weight(x);
    const int b = static_cast<int>(std::min(-x, span) * to_bucket);
    bucket[i] = static_cast<std::uint16_t>(std::min(b, kBuckets - 1));
  }
  s.bucket_sum.assign(kBuckets, 0.0);
  double* sum = s.bucket_sum.data();
  for (std::size_t i = 0; i < n; ++i) sum[bucket[i]] += w[i];  // a zero weight adds nothing
  return max_l;
}

TokenId draw_bucketed(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index,
                      SamplerScratch& s) {
  const std::size_t n = logits.size();
  bucket_row(logits, p.temperature, s);
  const float* w = s.weights.data();
  const std::uint16_t* bucket = s.bucket.data();
  double total = 0.0;
  for (double sum : s.bucket_sum) total += sum;
  const double target = uniform_draw(p.seed, draw_index) * total;
  const double margin = total * (4.0 * static_cast<double>(n) + 16.0) * 0x1p-53;
  double cum = 0.0;
  int b = 0;
  while (b < kBuckets && !(target < cum + s.bucket_sum[static_cast<std::size_t>(b)])) cum += s.bucket_sum[static_cast<std::size_t>(b++)];
  if (b == kBuckets || target - cum < margin) return -1;
  std::vector<TokenId>& ids = s.ids;
  ids.clear();
  for (std::size_t i = 0; i < n; ++i)  // a zero weight is never drawn (and sorts after every positive one)
    if (bucket[i] == b && w[i] > 0.0f) ids.push_back(static_cast<TokenId>(i));
  std::sort(ids.begin(), ids.end(), ByLogit{logits});
  for (TokenId id : ids) {
    const double before = cum;
    cum += w[static_cast<std::size_t>(id)];
    if (target < cum) return target - before >= margin && cum - target >= margin ? id : -1;
  }
  return -1;
}

bool temperature_only(const SamplingParams& p, std::size_t vocab) {
  return !(p.top_k > 0 && static_cast<std::size_t>(p.top_k) < vocab) && p.top_p >= 1.0f && p.min_p <= 0.0f;
}

// The reference's top-p and min-p cuts and draw over the exact sorted prefix `ids` of the reference's order,
// normalised by `total` (the bucket sums' total, not the reference's left-to-right sum: they differ by at
// most `tol` relative, as do every prob and partial sum below). Every comparison that decides the answer
// must clear its boundary by more than that, else -1 (the caller takes the exact path). `tail`: the
// reference has candidates after the prefix (a cut that does not happen inside it needs them).
TokenId cut_and_draw(const SamplingParams& p, std::uint64_t draw_index, SamplerScratch& s, double total, double tol,
                     bool tail) {
  const std::vector<TokenId>& ids = s.ids;
  std::vector<double>& probs = s.probs;
  std::size_t keep = ids.size();
  probs.resize(keep);
  for (std::size_t i = 0; i < keep; ++i) probs[i] = s.weights[static_cast<std::size_t>(ids[i])] / total;
  const auto near = [tol](double a, double b) { return std::abs(a - b) <= tol * std::max(std::abs(a), std::abs(b)); };
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    std::size_t n = 0;
    for (; n < keep; cum += probs[n++]) {
      if (near(cum, p.top_p)) return -1;
      if (!(cum < p.top_p)) break;
    }
    // Every prefix id taken: the last sum decides (the reference's cut, or its candidates beyond the prefix).
    if (n == keep && (near(cum, p.top_p) || (cum < p.top_p && tail))) return -1;
    keep = std::max<std::size_t>(n, 1);
    tail = false;
  }
  if (p.min_p > 0.0f) {
    std::size_t n = 1;
    for (; n < keep; ++n) {
      const double bar = p.min_p * probs[0];
      if (near(probs[n], bar)) return -1;
      if (!(probs[n] >= bar)) break;
    }
    if (n == keep && tail) return -1;
    keep = n;
    tail = false;
  }
  if (tail) return -1;
  double mass = 0.0;
  for (std::size_t i = 0; i < keep; ++i) mass += probs[i];
  const double target = uniform_draw(p.seed, draw_index) * mass;
  double cum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    const double before = cum;
    cum += probs[i];
    if (target < cum) return near(target, before) || near(target, cum) ? -1 : ids[i];
  }
  return -1;  // the reference's fall-through (rounding at the very end): leave it to the exact path
}

// top-p and/or min-p without top-k: the reference's answer without sorting the vocabulary. The buckets
// (draw_bucketed's) are walked from the top until they hold top_p of the total mass with room to spare (or,
// min-p alone, until their weights fall below min_p of the largest, 1); only their ids are sorted, and the
// cuts and the draw run over that exact prefix of the reference's order. -1: the exact path decides.
TokenId draw_bucketed_cut(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index,
                          SamplerScratch& s) {
  const std::size_t n = logits.size();
  float width_x = 0.0f;
  bucket_row(logits, p.temperature, s, &width_x);
  double total = 0.0;
  for (double sum : s.bucket_sum) total += sum;
  const double tol = (8.0 * static_cast<double>(n) + 64.0) * 0x1p-53;
  int last = kBuckets - 1;  // the last bucket of the prefix
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    const double want = (static_cast<double>(p.top_p) + 4.0 * tol) * total;
    for (last = 0; last < kBuckets; ++last)
      if ((cum += s.bucket_sum[static_cast<std::size_t>(last)]) >= want) break;
    if (last == kBuckets) return -1;  // top_p within rounding of the whole mass
  } else {  // min-p alone: weights >= min_p, i.e. x >= log(min_p), and one bucket more for rounding
    const double x_cut = std::log(static_cast<double>(p.min_p));
    last = static_cast<int>(std::min<double>(kBuckets - 1, -x_cut / static_cast<double>(width_x) + 1.0));
  }
  std::vector<TokenId>& ids = s.ids;
  ids.clear();
  const float* w = s.weights.data();
  const std::uint16_t* bucket = s.bucket.data();
  for (std::size_t i = 0; i < n; ++i)  // zero weights sort after every positive one: never in the prefix
    if (bucket[i] <= last && w[i] > 0.0f) ids.push_back(static_cast<TokenId>(i));
  if (ids.empty()) return -1;
  radix_sort_desc(logits, ids, s.keys, s.swap);
  return cut_and_draw(p, draw_index, s, total, tol, ids.size() < n);
}

}  // namespace

TokenId sample(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index) {
  SamplerScratch scratch;
  return sample(logits, p, draw_index, scratch);
}

TokenId sample(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index,
               SamplerScratch& scratch) {
  if (logits.empty()) throw std::invalid_argument("sample: empty logits");
  if (p.temperature == 0.0f) return greedy(logits);
  if (temperature_only(p, logits.size())) {
    if (const TokenId t = draw_bucketed(logits, p, draw_index, scratch); t >= 0) return t;
    return sample_reference(logits, p, draw_index);
  }
  if (!(p.top_k > 0 && static_cast<std::size_t>(p.top_k) < logits.size()))
    if (const TokenId t = draw_bucketed_cut(logits, p, draw_index, scratch); t >= 0) return t;
  const std::size_t head = sorted_head(logits, p, scratch);
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

// log sum exp(l), with the sampler's float weights (sampler_weights.h: relative error under 2e-7 per term, far
// below a float logprob's own rounding once max_l is added back) summed in double over 8 fixed lanes, combined
// in a fixed order: no libm call per entry, and the same value whatever the batch or the thread.
double log_normalizer(std::span<const float> logits) {
  const float max_l = row_range(logits).max;
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
  ids.resize(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(top), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), ByLogit{logits});
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
