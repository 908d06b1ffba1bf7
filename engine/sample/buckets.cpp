// sample()'s paths that sort next to nothing (sample/buckets.h). The ids fall into buckets over the row's
// x = (l - max) / T (sample/scan.h), which keep the reference's sorted order between buckets: bucket sums
// or counts say which bucket a cut or the draw lands in, and only that bucket is sorted.
//
// Rounding: the reference sums its probabilities left to right in sorted order; these paths sum the same
// positive terms in another order (per bucket, then bucket by bucket). Two sums of the same m positive
// terms differ by at most ~2m ulp of the larger, so over a row of n ids every partial sum, probability
// and total here is within (3n + 64) ulp, relatively, of the reference's. A comparison that decides the
// answer must clear its boundary by more than `tol` = (8n + 64) ulp, else the path returns -1 and sample()
// takes an exact one (a draw that near a boundary: a chance of order n^2 2^-53).
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/sample/buckets.h"
#include "engine/sample/scan.h"
#include "kernels/uniform_draw.h"

namespace kvfleet::sampler_detail {
namespace {

double tolerance(std::size_t n) { return (8.0 * static_cast<double>(n) + 64.0) * 0x1p-53; }

// The bucket sums in blocks of 16 and their total, so that the walks below are 64 dependent additions and
// 16, not 1,024: sums of the same positive terms in another grouping, within the rounding bound above.
constexpr int kPerBlock = 16, kBlocks = kBuckets / kPerBlock;
struct Blocks {
  double sum[kBlocks];
  double total;
};
void block_sums(const double* bucket_sum, Blocks& out) {
  for (int k = 0; k < kBlocks; ++k) {  // independent chains: they overlap
    double s = 0.0;
    for (int j = 0; j < kPerBlock; ++j) s += bucket_sum[k * kPerBlock + j];
    out.sum[k] = s;
  }
  double t = 0.0;
  for (double x : out.sum) t += x;
  out.total = t;
}

// Walks the buckets from the top: `stop(end)` gets the running sum at the end of each block, then of each
// bucket of the block it stopped at, and says 1 (here), 0 (on) or -1 (too close to call). Returns the bucket
// stopped at, with `cum` the sum before it; kBuckets when nothing stopped; -1 for a -1, or when a block
// stopped and none of its buckets did (their sums round differently).
template <class Stop>
int walk_buckets(const double* bucket_sum, const Blocks& blocks, double& cum, Stop stop) {
  int k = 0;
  for (; k < kBlocks; ++k) {
    const int r = stop(cum + blocks.sum[k]);
    if (r < 0) return -1;
    if (r > 0) break;
    cum += blocks.sum[k];
  }
  if (k == kBlocks) return kBuckets;
  for (int b = k * kPerBlock; b < (k + 1) * kPerBlock; ++b) {
    const int r = stop(cum + bucket_sum[b]);
    if (r < 0) return -1;
    if (r > 0) return b;
    cum += bucket_sum[b];
  }
  return -1;
}

// Every id's weight and bucket, each bucket's weight sum, in s; returns the bucket width in x.
float bucket_row(std::span<const float> logits, float t, SamplerScratch& s) {
  const std::size_t n = logits.size();
  const Range range = row_range(logits);
  if (!std::isfinite(range.max)) no_finite_logit();
  const Bucketing g = make_bucketing(range, t);
  s.weights.resize(n);
  s.bucket.resize(n);
  s.bucket_sum.resize(kBuckets);
  weigh_and_bucket(logits, g, s.weights.data(), s.bucket.data(), s.bucket_sum.data(), s.next_row);
  return g.span / static_cast<float>(kBuckets);
}

// s.ids = bucket b's ids with a positive weight (a zero weight is never drawn and sorts after every
// positive one), sorted as the reference sorts them.
void sorted_bucket(std::span<const float> logits, int b, SamplerScratch& s) {
  std::vector<TokenId>& ids = s.ids;
  ids.clear();
  collect_buckets(s.bucket.data(), logits.size(), b, b, ids);
  const float* w = s.weights.data();
  std::erase_if(ids, [w](TokenId id) { return !(w[static_cast<std::size_t>(id)] > 0.0f); });
  radix_sort_desc(logits, ids, s.keys, s.swap);
}

bool near(double a, double b, double tol) { return std::abs(a - b) <= tol * std::max(std::abs(a), std::abs(b)); }

// The draw's id among s.ids[0, count) (sorted, their weights following `cum`): the first whose cumulative
// sum passes target, or -1 when target is within tol of a boundary or passes them all.
TokenId walk_ids(const SamplerScratch& s, std::size_t count, double cum, double target, double tol) {
  for (std::size_t i = 0; i < count; ++i) {
    const double before = cum;
    const TokenId id = s.ids[i];
    cum += s.weights[static_cast<std::size_t>(id)];
    if (target < cum) return near(target, before, tol) || near(target, cum, tol) ? -1 : id;
  }
  return -1;
}

}  // namespace

// The draw in weight units: the walk over the bucket sums finds the bucket the draw lands in; the margin
// is tol's in absolute terms (sums of weights, not probabilities).
TokenId draw_bucketed(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index,
                      SamplerScratch& s) {
  const std::size_t n = logits.size();
  bucket_row(logits, p.temperature, s);
  Blocks blocks;
  block_sums(s.bucket_sum.data(), blocks);
  const double total = blocks.total;
  const double target = kernels::uniform_draw(p.seed, draw_index) * total;
  const double margin = total * (4.0 * static_cast<double>(n) + 16.0) * 0x1p-53;
  double cum = 0.0;
  const int b = walk_buckets(s.bucket_sum.data(), blocks, cum, [target](double end) { return target < end ? 1 : 0; });
  if (b < 0 || b == kBuckets || target - cum < margin) return -1;
  sorted_bucket(logits, b, s);
  for (TokenId id : s.ids) {
    const double before = cum;
    cum += s.weights[static_cast<std::size_t>(id)];
    if (target < cum) return target - before >= margin && cum - target >= margin ? id : -1;
  }
  return -1;
}

// The reference's top-p loop keeps ids while the sum of the probabilities before them is < top_p. In
// bucket terms: every bucket before the first whose end reaches top_p is kept whole; that bucket (c) is
// sorted and walked id by id to the cut. The draw then lands in a bucket before c (sorted in turn) or among
// c's kept ids. The mass the draw scales is the kept ids' sum, as the reference's. Everything runs in
// weight units (the reference's probabilities times the total: one rounding more, within tol), so that
// the walks over the buckets are additions, not a division per bucket.
TokenId draw_top_p(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index, SamplerScratch& s) {
  const std::size_t n = logits.size();
  bucket_row(logits, p.temperature, s);
  const double* sum = s.bucket_sum.data();
  Blocks blocks;
  block_sums(sum, blocks);
  const double tol = tolerance(n), want = static_cast<double>(p.top_p) * blocks.total;
  double cum = 0.0;  // the weight before bucket c
  const int c = walk_buckets(sum, blocks, cum, [want, tol](double end) {
    return near(end, want, tol) ? -1 : end >= want ? 1 : 0;
  });
  if (c < 0 || c == kBuckets) return -1;  // too close to call, or top_p within rounding of the whole mass
  sorted_bucket(logits, c, s);
  std::size_t kept = 0;  // c's ids the cut keeps
  double mass = cum;
  for (; kept < s.ids.size(); ++kept) {
    if (near(mass, want, tol)) return -1;
    if (!(mass < want)) break;
    mass += s.weights[static_cast<std::size_t>(s.ids[kept])];
  }
  if (kept == s.ids.size() && (near(mass, want, tol) || mass < want)) return -1;  // the bucket sum said >=
  const double target = kernels::uniform_draw(p.seed, draw_index) * mass;
  if (near(target, cum, tol)) return -1;
  if (!(target < cum)) return walk_ids(s, kept, cum, target, tol);  // among c's kept ids
  double at = 0.0;
  const int b = walk_buckets(sum, blocks, at, [target, tol](double end) {
    return near(target, end, tol) ? -1 : target < end ? 1 : 0;
  });
  if (b < 0 || b >= c) return -1;  // rounding put the draw past the kept buckets' sums
  sorted_bucket(logits, b, s);
  return walk_ids(s, s.ids.size(), at, target, tol);
}

namespace {

// The reference's top-p and min-p cuts and draw over the exact sorted prefix `ids` of the reference's order,
// normalised by `total` (the bucket sums' total). `tail`: the reference has candidates after the prefix (a
// cut that does not happen inside it needs them).
TokenId cut_and_draw(const SamplingParams& p, std::uint64_t draw_index, SamplerScratch& s, double total, double tol,
                     bool tail) {
  const std::vector<TokenId>& ids = s.ids;
  std::vector<double>& probs = s.probs;
  std::size_t keep = ids.size();
  probs.resize(keep);
  for (std::size_t i = 0; i < keep; ++i) probs[i] = s.weights[static_cast<std::size_t>(ids[i])] / total;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    std::size_t n = 0;
    for (; n < keep; cum += probs[n++]) {
      if (near(cum, p.top_p, tol)) return -1;
      if (!(cum < p.top_p)) break;
    }
    // Every prefix id taken: the last sum decides (the reference's cut, or its candidates beyond the prefix).
    if (n == keep && (near(cum, p.top_p, tol) || (cum < p.top_p && tail))) return -1;
    keep = std::max<std::size_t>(n, 1);
    tail = false;
  }
  if (p.min_p > 0.0f) {
    std::size_t n = 1;
    for (; n < keep; ++n) {
      const double bar = p.min_p * probs[0];
      if (near(probs[n], bar, tol)) return -1;
      if (!(probs[n] >= bar)) break;
    }
    if (n == keep && tail) return -1;
    keep = n;
    tail = false;
  }
  if (tail) return -1;
  double mass = 0.0;
  for (std::size_t i = 0; i < keep; ++i) mass += probs[i];
  const double target = kernels::uniform_draw(p.seed, draw_index) * mass;
  double cum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    const double before = cum;
    cum += probs[i];
    if (target < cum) return near(target, before, tol) || near(target, cum, tol) ? -1 : ids[i];
  }
  return -1;  // the reference's fall-through (rounding at the very end): leave it to the exact path
}

}  // namespace

// The buckets are walked from the top until they hold top_p of the total mass with room to spare (or,
// min-p alone, until their weights fall below min_p of the largest, 1); only their ids are sorted, and the
// cuts and the draw run over that exact prefix of the reference's order.
TokenId draw_bucketed_cut(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index,
                          SamplerScratch& s) {
  const std::size_t n = logits.size();
  const float width_x = bucket_row(logits, p.temperature, s);
  Blocks blocks;
  block_sums(s.bucket_sum.data(), blocks);
  const double total = blocks.total;
  const double tol = tolerance(n);
  bool past_prefix_matters = true;
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
    // An id past the prefix has x < log(min_p) - width_x + 2e-5 (the bucket's float product rounds by 2^-24
    // of at most 1024 buckets' 88): with buckets 1e-3 wide its weight is below min_p by far more than
    // exp_weight's error (2e-7), so the reference's min-p cut ends inside the prefix or at its end and
    // the ids past it are not needed (without this, a row whose buckets just past the cut are empty
    // would go to the exact path).
    if (width_x >= 1e-3f) past_prefix_matters = false;
  }
  std::vector<TokenId>& ids = s.ids;
  ids.clear();
  collect_buckets(s.bucket.data(), n, 0, last, ids);
  const float* w = s.weights.data();
  std::erase_if(ids, [w](TokenId id) { return !(w[static_cast<std::size_t>(id)] > 0.0f); });  // never in the prefix
  if (ids.empty()) return -1;
  radix_sort_desc(logits, ids, s.keys, s.swap);
  return cut_and_draw(p, draw_index, s, total, tol, past_prefix_matters && ids.size() < n);
}

// min-p alone. The reference keeps ids, in its order, while probs[n] >= min_p * probs[0], that is (probs =
// w / total, the maximum's weight 1) while w >= min_p, up to rounding. A bucket whose x range lies wholly
// above log(min_p) by more than the weights' error (2e-7) and the x and bucket roundings holds only kept
// ids, one wholly below it only dropped ones: only the few buckets around the cut (the zone) are sorted and
// walked as the reference walks them. The draw then lands in a bucket above the zone (sorted in turn) or
// among the zone's kept ids; in weight units, as draw_top_p.
TokenId draw_min_p(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index, SamplerScratch& s) {
  const std::size_t n = logits.size();
  const float width_x = bucket_row(logits, p.temperature, s);
  const double x_cut = std::log(static_cast<double>(p.min_p));
  if (!(x_cut > -80.0)) return -1;  // a cut in the last bucket's clamped range: the sorted-prefix path
  // Bucket of x is floor(-x / width_x) up to 1e-4 of a bucket (a float product of at most 1024); the zone
  // spans x_cut -+ 1e-6 and a bucket more on each side.
  // A cut below the row's range puts the zone in the last bucket (every id kept).
  const double at = std::min<double>(-x_cut / static_cast<double>(width_x), kBuckets);
  const double slack = 1e-6 / static_cast<double>(width_x) + 1e-3;
  const int z0 = std::clamp(static_cast<int>(std::floor(at - slack)) - 1, 0, kBuckets - 1);
  const int z1 = std::clamp(static_cast<int>(std::floor(at + slack)) + 1, z0, kBuckets - 1);
  const double* sum = s.bucket_sum.data();
  Blocks blocks;
  block_sums(sum, blocks);
  const double tol = tolerance(n);
  double above = 0.0;  // the weight of the buckets above the zone, all kept
  for (int b = 0; b < z0; ++b) above += sum[b];
  std::vector<TokenId>& ids = s.ids;
  ids.clear();
  collect_buckets(s.bucket.data(), n, z0, z1, ids);
  const float* w = s.weights.data();
  std::erase_if(ids, [w](TokenId id) { return !(w[static_cast<std::size_t>(id)] > 0.0f); });
  radix_sort_desc(logits, ids, s.keys, s.swap);
  // The reference's cut over the zone: its first id is the reference's first when the zone starts at 0.
  std::size_t kept = z0 == 0 && !ids.empty() ? 1 : 0;
  const double bar = static_cast<double>(p.min_p);
  double mass = above;
  for (std::size_t i = 0; i < kept; ++i) mass += w[static_cast<std::size_t>(ids[i])];
  for (; kept < ids.size(); ++kept) {
    const double wi = w[static_cast<std::size_t>(ids[kept])];
    if (near(wi, bar, tol)) return -1;
    if (!(wi >= bar)) break;
    mass += wi;
  }
  // Every zone id kept: the next one, below the zone, is clearly dropped (the zone's width promises it).
  if (mass <= 0.0) return -1;
  const double target = kernels::uniform_draw(p.seed, draw_index) * mass;
  if (near(target, above, tol)) return -1;
  if (!(target < above)) return walk_ids(s, kept, above, target, tol);  // among the zone's kept ids
  double cum = 0.0;
  const int b = walk_buckets(sum, blocks, cum, [target, tol](double end) {
    return near(target, end, tol) ? -1 : target < end ? 1 : 0;
  });
  if (b < 0 || b >= z0) return -1;
  sorted_bucket(logits, b, s);
  return walk_ids(s, s.ids.size(), cum, target, tol);
}

// Buckets over l - max (temperature 1: only the order matters) are monotone in the logit, so the ids of the
// buckets down to the one that reaches k ids hold the first k of the reference's order.
void select_top_k(std::span<const float> logits, std::size_t k, SamplerScratch& s) {
  const std::size_t n = logits.size();
  const Range range = row_range(logits);
  if (!std::isfinite(range.max)) no_finite_logit();
  s.bucket.resize(n);
  s.bucket_count.resize(kBuckets);
  count_buckets(logits, make_bucketing(range, 1.0f), s.bucket.data(), s.bucket_count.data(), s.next_row);
  std::size_t have = 0;
  int last = 0;
  for (; last < kBuckets - 1; ++last)
    if ((have += s.bucket_count[static_cast<std::size_t>(last)]) >= k) break;
  std::vector<TokenId>& ids = s.ids;
  ids.clear();
  collect_buckets(s.bucket.data(), n, 0, last, ids);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), ByLogit{logits});
}

}  // namespace kvfleet::sampler_detail
