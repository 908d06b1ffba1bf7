#include "kvfleet/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

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

// NaN compares as -inf, so that every ordering below is a strict weak ordering (std::sort's comparator
// with NaN is undefined behaviour) and a NaN is never chosen over a number.
float ordered(float l) { return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l; }

// Descending by logit, ties by id: the order every filter below cuts a prefix of.
struct ByLogit {
  std::span<const float> logits;
  bool operator()(TokenId a, TokenId b) const {
    const float la = ordered(logits[static_cast<std::size_t>(a)]), lb = ordered(logits[static_cast<std::size_t>(b)]);
    return la > lb || (la == lb && a < b);
  }
};

[[noreturn]] void no_finite_logit() { throw std::invalid_argument("sample: the logits hold no finite maximum"); }

}  // namespace

TokenId sample(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index) {
  if (logits.empty()) throw std::invalid_argument("sample: empty logits");
  if (p.temperature == 0.0f) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); ++i)
      if (ordered(logits[i]) > ordered(logits[best])) best = i;
    if (!std::isfinite(logits[best])) no_finite_logit();
    return static_cast<TokenId>(best);
  }

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
  // Softmax of logits / temperature over the kept candidates, in double.
  const double max_l = logits[static_cast<std::size_t>(ids[0])];
  if (!std::isfinite(max_l)) no_finite_logit();
  std::vector<double> probs(keep);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i)
    total += probs[i] = std::exp((ordered(logits[static_cast<std::size_t>(ids[i])]) - max_l) / p.temperature);
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

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, TokenId chosen, int top, float* chosen_logprob) {
  float max_l = -std::numeric_limits<float>::infinity();
  for (float l : logits) max_l = std::max(max_l, ordered(l));
  if (!std::isfinite(max_l)) no_finite_logit();
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(ordered(l)) - max_l);
  const double log_z = max_l + std::log(sum);
  if (chosen_logprob) *chosen_logprob = static_cast<float>(ordered(logits[static_cast<std::size_t>(chosen)]) - log_z);
  std::vector<TokenLogprob> out;
  if (top <= 0) return out;
  std::vector<TokenId> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(top), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), ByLogit{logits});
  for (std::size_t i = 0; i < k; ++i)
    out.push_back({ids[i], static_cast<float>(logits[static_cast<std::size_t>(ids[i])] - log_z)});
  return out;
}

}  // namespace kvfleet
