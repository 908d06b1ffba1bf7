// apply_token_mask and the sampler under a grammar's mask: masked ids get -inf, and no sampler path (the
// bucketed draws, top-k, top-p, min-p, the reference they fall back to) ever returns one, even when fewer
// ids are allowed than top-k keeps or the allowed ids sit at the bottom of the distribution.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kvfleet/sampler.h"
#include "kvfleet/token_constraint.h"

using namespace kvfleet;

namespace {

std::vector<std::uint32_t> mask_of(std::size_t vocab, const std::vector<TokenId>& allowed) {
  std::vector<std::uint32_t> m(bitmask_words(vocab), 0u);
  for (TokenId t : allowed) m[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
  return m;
}

}  // namespace

TEST_CASE("apply_token_mask: exactly the allowed ids keep their logits; ids past the mask are masked") {
  std::vector<float> row(70);
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>(i) * 0.5f - 3.0f;
  const auto original = row;
  const std::vector<TokenId> allowed{0, 31, 32, 33, 63};
  auto mask = mask_of(64, allowed);  // two words: ids 64..69 lie past it
  CHECK(apply_token_mask(row, mask));
  for (std::size_t i = 0; i < row.size(); ++i) {
    CAPTURE(i);
    const bool keep = std::find(allowed.begin(), allowed.end(), static_cast<TokenId>(i)) != allowed.end();
    if (keep) CHECK(row[i] == original[i]);
    else CHECK(row[i] == -std::numeric_limits<float>::infinity());
  }
  // All ones, all zeros.
  std::vector<float> full = original;
  CHECK(apply_token_mask(full, std::vector<std::uint32_t>(3, ~0u)));
  CHECK(full == original);
  std::vector<float> none = original;
  CHECK_FALSE(apply_token_mask(none, std::vector<std::uint32_t>(3, 0u)));
  // Allowed ids whose logits are already -inf (unshowable): nothing can be sampled.
  std::vector<float> dead = original;
  dead[5] = -std::numeric_limits<float>::infinity();
  CHECK_FALSE(apply_token_mask(dead, mask_of(70, {5})));
}

TEST_CASE("no sampler path returns a masked id") {
  std::mt19937 rng(2024);
  struct Knobs {
    float temperature;
    std::int32_t top_k;
    float top_p, min_p;
  };
  const Knobs knobs[] = {{0.0f, 0, 1.0f, 0.0f},  {1.0f, 0, 1.0f, 0.0f},   {0.3f, 0, 1.0f, 0.0f},  {2.0f, 0, 1.0f, 0.0f},
                         {1.0f, 5, 1.0f, 0.0f},  {1.0f, 100, 1.0f, 0.0f}, {1.0f, 0, 0.9f, 0.0f},  {1.0f, 0, 0.999f, 0.0f},
                         {1.0f, 0, 1.0f, 0.05f}, {0.8f, 50, 0.95f, 0.1f}, {1.0f, 40, 0.5f, 0.0f}, {1.5f, 0, 0.7f, 0.01f}};
  std::normal_distribution<float> normal(0.0f, 3.0f);
  SamplerScratch scratch;
  int trials = 0;
  for (const std::size_t vocab : {300u, 1000u, 5000u}) {
    for (int t = 0; t < 60; ++t) {
      std::vector<float> row(vocab);
      for (auto& l : row) l = normal(rng);
      // 1 to 40 allowed ids; in a third of the rows they are the least likely ones.
      std::vector<TokenId> allowed;
      const std::size_t n = 1 + rng() % 40;
      for (std::size_t i = 0; i < n; ++i) allowed.push_back(static_cast<TokenId>(rng() % vocab));
      if (t % 3 == 0)
        for (TokenId a : allowed) row[static_cast<std::size_t>(a)] = -30.0f - static_cast<float>(rng() % 20);
      const auto mask = mask_of(vocab, allowed);
      REQUIRE(apply_token_mask(row, mask));
      for (const Knobs& k : knobs) {
        const SamplingParams p{k.temperature, k.top_k, k.top_p, k.min_p, rng()};
        for (std::uint64_t draw = 0; draw < 4; ++draw) {
          const TokenId got = sample(row, p, draw, scratch);
          CAPTURE(vocab);
          CAPTURE(t);
          CHECK(bitmask_allows(mask, got));
          CHECK(got == sample_reference(row, p, draw));
          ++trials;
        }
      }
    }
  }
  CHECK(trials == 3 * 60 * 12 * 4);
}
