#include "engine/spec/draft_probs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace kvfleet::spec {

namespace {

// Distinct streams: the seed is mixed with a constant per purpose before uniform_draw's own mixing.
constexpr std::uint64_t kDraftStream = 0x9e3779b97f4a7c15ull, kAcceptStream = 0xc2b2ae3d27d4eb4full,
                        kResidualStream = 0x165667b19e3779f9ull;

}  // namespace

double draft_draw(std::uint64_t seed, std::uint64_t position) { return uniform_draw(seed ^ kDraftStream, position); }
double accept_draw(std::uint64_t seed, std::uint64_t position) { return uniform_draw(seed ^ kAcceptStream, position); }
double residual_draw(std::uint64_t seed, std::uint64_t position) {
  return uniform_draw(seed ^ kResidualStream, position);
}

void sampling_probs(std::span<const float> logits, const SamplingParams& p, std::vector<float>& out) {
  const std::size_t n = logits.size();
  out.assign(n, 0.0f);
  if (n == 0) throw std::invalid_argument("sample: empty logits");
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  const float max_l = logits[best];
  if (!std::isfinite(max_l)) throw std::invalid_argument("sample: no finite logit");
  if (p.temperature == 0.0f) {
    out[best] = 1.0f;
    return;
  }
  std::vector<double> w(n);
  for (std::size_t i = 0; i < n; ++i)
    w[i] = std::isfinite(logits[i]) ? std::exp(static_cast<double>(logits[i] - max_l) / p.temperature) : 0.0;
  const bool top_k = p.top_k > 0 && static_cast<std::size_t>(p.top_k) < n;
  if (top_k || p.top_p < 1.0f || p.min_p > 0.0f) {
    // The cuts are prefixes of the candidates sorted by logit (descending, ties by id), as sample() has them.
    std::vector<std::size_t> ids(n);
    std::iota(ids.begin(), ids.end(), std::size_t{0});
    std::stable_sort(ids.begin(), ids.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
    std::size_t keep = top_k ? static_cast<std::size_t>(p.top_k) : n;
    double total = 0.0;
    for (std::size_t i = 0; i < keep; ++i) total += w[ids[i]];
    if (p.top_p < 1.0f) {
      double cum = 0.0;
      std::size_t m = 0;
      while (m < keep && cum < p.top_p) cum += w[ids[m++]] / total;
      keep = std::max<std::size_t>(m, 1);
    }
    if (p.min_p > 0.0f) {
      std::size_t m = 1;
      while (m < keep && w[ids[m]] >= p.min_p * w[ids[0]]) ++m;
      keep = m;
    }
    for (std::size_t i = keep; i < n; ++i) w[ids[i]] = 0.0;
  }
  double total = 0.0;
  for (double x : w) total += x;
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(w[i] / total);
}

TokenId draw_from(std::span<const float> probs, double u) {
  double total = 0.0;
  for (float x : probs) total += x;
  const double target = u * total;
  double cum = 0.0;
  std::size_t last = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] > 0.0f)) continue;
    last = i;
    cum += probs[i];
    if (target < cum) return static_cast<TokenId>(i);
  }
  return static_cast<TokenId>(last);
}

Verdict accept_or_resample(std::span<const float> p, std::span<const float> q, TokenId draft, double u_accept,
                           double u_residual, std::vector<float>& scratch) {
  const auto d = static_cast<std::size_t>(draft);
  if (d < p.size() && u_accept * q[d] < p[d]) return {draft, true};
  scratch.resize(p.size());
  double mass = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) mass += scratch[i] = std::max(0.0f, p[i] - q[i]);
  if (!(mass > 0.0)) return {draw_from(p, u_residual), false};
  return {draw_from(scratch, u_residual), false};
}

}  // namespace kvfleet::spec
