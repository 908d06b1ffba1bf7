#include "kvfleet/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

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

double uniform_draw(std::uint64_t seed, std::uint64_t index) {
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const std::uint64_t bits = mix(mix(seed) ^ index);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

TokenId sample(std::span<const float> logits, const SamplingParams& p, std::uint64_t draw_index) {
  if (logits.empty()) throw std::invalid_argument("sample: empty logits");
  if (p.temperature == 0.0f)
    return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());

  // Candidates sorted by logit (descending, ties by id) so every filter below is a prefix cut.
  std::vector<TokenId> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto by_logit = [&](TokenId a, TokenId b) {
    const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::size_t keep = ids.size();
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < keep) {
    keep = static_cast<std::size_t>(p.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end(), by_logit);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  // Softmax of logits / temperature over the kept candidates, in double.
  const double max_l = logits[static_cast<std::size_t>(ids[0])];
  std::vector<double> probs(keep);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i)
    total += probs[i] = std::exp((logits[static_cast<std::size_t>(ids[i])] - max_l) / p.temperature);
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

}  // namespace kvfleet
