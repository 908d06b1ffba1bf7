#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>
#include <stdexcept>

#include "engine/sample/weights.h"
#include "kvfleet/sampler.h"

using namespace kvfleet;

TEST_CASE("greedy picks the largest logit, the lowest id on ties") {
  SamplingParams p;
  p.temperature = 0.0f;
  CHECK(sample(std::vector<float>{0.1f, 2.0f, -1.0f, 2.0f}, p, 0) == 1);
}

TEST_CASE("seeded sampling is a function of (seed, index) alone") {
  const std::vector<float> logits{1.0f, 1.5f, 0.5f, 2.0f, 0.0f};
  SamplingParams p;
  p.seed = 42;
  std::vector<TokenId> first, second;
  for (std::uint64_t i = 0; i < 50; ++i) first.push_back(sample(logits, p, i));
  for (std::uint64_t i = 0; i < 50; ++i) second.push_back(sample(logits, p, i));
  CHECK(first == second);
  p.seed = 43;
  std::vector<TokenId> other;
  for (std::uint64_t i = 0; i < 50; ++i) other.push_back(sample(logits, p, i));
  CHECK(other != first);
}

TEST_CASE("draws follow the softmax distribution") {
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f)};  // probabilities 1/6, 2/6, 3/6
  SamplingParams p;
  std::map<TokenId, int> counts;
  const int n = 60000;
  for (int i = 0; i < n; ++i) ++counts[sample(logits, p, static_cast<std::uint64_t>(i))];
  CHECK(counts[0] / double(n) == doctest::Approx(1.0 / 6).epsilon(0.05));
  CHECK(counts[1] / double(n) == doctest::Approx(2.0 / 6).epsilon(0.05));
  CHECK(counts[2] / double(n) == doctest::Approx(3.0 / 6).epsilon(0.05));
}

TEST_CASE("top-k, top-p and min-p cut the candidates") {
  const std::vector<float> logits{std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  auto support = [&](SamplingParams p) {
    std::map<TokenId, int> seen;
    for (std::uint64_t i = 0; i < 2000; ++i) ++seen[sample(logits, p, i)];
    std::vector<TokenId> ids;
    for (auto& [id, c] : seen) ids.push_back(id);
    return ids;
  };
  SamplingParams k;
  k.top_k = 2;
  CHECK(support(k) == std::vector<TokenId>{2, 3});
  SamplingParams tp;
  tp.top_p = 0.65f;  // 0.4 + 0.3 reaches 0.65
  CHECK(support(tp) == std::vector<TokenId>{2, 3});
  SamplingParams mp;
  mp.min_p = 0.45f;  // keep p >= 0.18
  CHECK(support(mp) == std::vector<TokenId>{1, 2, 3});
  SamplingParams low_t;
  low_t.temperature = 0.01f;
  CHECK(support(low_t) == std::vector<TokenId>{3});
}

TEST_CASE("out-of-range sampling values name the field") {
  SamplingParams p;
  p.top_p = 0.0f;
  CHECK_THROWS_WITH_AS(p.validate(), "top_p must be in (0, 1]", std::invalid_argument);
  p = {};
  p.temperature = -1.0f;
  CHECK_THROWS_WITH_AS(p.validate(), "temperature must be a finite number >= 0", std::invalid_argument);
  p = {};
  p.min_p = 2.0f;
  CHECK_THROWS_AS(p.validate(), std::invalid_argument);
}

TEST_CASE("penalties: repetition divides positive and multiplies negative logits; presence and frequency subtract") {
  std::vector<float> logits{2.0f, -2.0f, 1.0f, 1.0f};
  const std::vector<TokenId> prompt{0}, output{1, 2, 2};
  Penalties p;
  p.repetition = 2.0f;
  apply_penalties(logits, p, prompt, output);
  CHECK(logits == std::vector<float>{1.0f, -4.0f, 0.5f, 1.0f});
  logits = {2.0f, -2.0f, 1.0f, 1.0f};
  p = {};
  p.presence = 0.5f;
  p.frequency = 0.25f;
  apply_penalties(logits, p, prompt, output);  // the prompt does not count for these two
  CHECK(logits == std::vector<float>{2.0f, -2.75f, 0.0f, 1.0f});
}

TEST_CASE("logprobs come from the raw logits") {
  const std::vector<float> logits{std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  float chosen = 0;
  const auto top = top_logprobs(logits, 2, 2, &chosen);
  CHECK(chosen == doctest::Approx(std::log(0.25)));
  REQUIRE(top.size() == 2);
  CHECK(top[0].id == 0);
  CHECK(top[0].logprob == doctest::Approx(std::log(0.5)));
  CHECK(top[1].id == 1);  // ties go to the lower id
}

TEST_CASE("NaN logits never reach a comparator: they count as -inf, and a row without a finite logit throws") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  // max_element with operator< kept a leading NaN as the "largest"; it must lose to every number.
  CHECK(sample(std::vector<float>{nan, 0.5f, 2.0f, nan, 1.0f}, greedy, 0) == 2);
  SamplingParams hot;
  hot.seed = 7;
  std::vector<float> row(64, 0.0f);
  for (std::size_t i = 0; i < row.size(); i += 3) row[i] = nan;
  for (std::uint64_t draw = 0; draw < 200; ++draw) {
    const TokenId t = sample(row, hot, draw);
    REQUIRE(t >= 0);
    CHECK(!std::isnan(row[static_cast<std::size_t>(t)]));
  }
  hot.top_k = 5;
  CHECK(!std::isnan(row[static_cast<std::size_t>(sample(row, hot, 1))]));
  CHECK_THROWS_AS(sample(std::vector<float>{nan, nan}, greedy, 0), std::invalid_argument);
  CHECK_THROWS_AS(sample(std::vector<float>{nan, -inf}, hot, 0), std::invalid_argument);
  float lp = 0.0f;
  const auto top = top_logprobs(std::vector<float>{nan, 1.0f, 0.0f}, 1, 2, &lp);
  REQUIRE(top.size() == 2);
  CHECK(top[0].id == 1);
  CHECK(top[1].id == 2);
  CHECK(std::isfinite(lp));
}

TEST_CASE("sample() picks exactly the reference's token (a full sort) for every setting and seed") {
  std::mt19937 rng(3);
  SamplerScratch scratch;
  int checked = 0;
  for (const std::size_t vocab : {std::size_t{7}, std::size_t{300}, std::size_t{5000}}) {
    for (const float spread : {0.5f, 4.0f, 40.0f, 400.0f}) {  // flat to peaked: heads from all to a few ids
      std::normal_distribution<float> normal(0.0f, spread);
      std::vector<float> logits(vocab);
      for (auto& l : logits) l = normal(rng);
      logits[vocab / 2] = logits[vocab / 3];  // a tie
      logits[1] = -0.0f;
      logits[2] = 0.0f;
      logits[3] = -std::numeric_limits<float>::infinity();
      for (const float t : {0.3f, 1.0f, 2.5f})
        for (const std::int32_t k : {0, 1, 5, 64, 4000})
          for (const float top_p : {1.0f, 0.9f, 0.999999f})
            for (const float min_p : {0.0f, 0.05f, 1e-30f}) {
              SamplingParams p;
              p.temperature = t;
              p.top_k = k;
              p.top_p = top_p;
              p.min_p = min_p;
              for (std::uint64_t i = 0; i < 6; ++i) {
                p.seed = i * 977;
                CAPTURE(vocab);
                CAPTURE(spread);
                CAPTURE(t);
                CAPTURE(k);
                CAPTURE(top_p);
                CAPTURE(min_p);
                REQUIRE(sample(logits, p, i, scratch) == sample_reference(logits, p, i));
                ++checked;
              }
            }
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("the sampler's float exp stays within 3e-7 of exp() and is exactly 1 at 0, 0 below -87") {
  using sampler_detail::exp_weight;
  CHECK(exp_weight(0.0f) == 1.0f);
  CHECK(exp_weight(-0.0f) == 1.0f);
  CHECK(exp_weight(-87.5f) == 0.0f);
  CHECK(exp_weight(-std::numeric_limits<float>::infinity()) == 0.0f);
  double worst = 0.0;
  for (int i = 0; i <= 870000; ++i) {
    const float x = -static_cast<float>(i) * 1e-4f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(static_cast<double>(exp_weight(x)) - want) / want);
  }
  MESSAGE("largest relative error of exp_weight on [-87, 0]: " << worst);
  CHECK(worst < 3e-7);
}

TEST_CASE("temperature alone: the bucketed draw picks the reference's token on large flat and peaked rows") {
  // Many ids per bucket (flat rows over a large vocabulary) and rows with a few dominant ids.
  std::mt19937 rng(11);
  SamplerScratch scratch;
  int checked = 0;
  for (const float spread : {0.05f, 2.0f, 8.0f}) {
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> logits(32000);
    for (auto& l : logits) l = normal(rng);
    logits[100] = logits[31000];  // a tie across the row
    for (const float t : {0.7f, 1.0f, 1.5f}) {
      SamplingParams p;
      p.temperature = t;
      for (std::uint64_t i = 0; i < 12; ++i) {
        p.seed = 31 * i + 7;
        CAPTURE(spread);
        CAPTURE(t);
        CAPTURE(i);
        REQUIRE(sample(logits, p, i, scratch) == sample_reference(logits, p, i));
        ++checked;
      }
    }
  }
  CHECK(checked == 108);
}

TEST_CASE("PenaltyState gives apply_penalties' logits, token after token") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<TokenId> id(-2, 60);  // out-of-range ids are ignored by both
  std::vector<TokenId> prompt(20), output;
  for (auto& t : prompt) t = id(rng);
  std::vector<float> base(50);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (auto& l : base) l = normal(rng);
  for (const Penalties pen : {Penalties{0.5f, 0.25f, 1.0f}, Penalties{0.0f, 0.0f, 1.3f}, Penalties{-0.4f, 0.7f, 0.8f}}) {
    PenaltyState state;
    output.clear();
    for (int step = 0; step < 40; ++step) {
      std::vector<float> want = base, got = base;
      apply_penalties(want, pen, prompt, output);
      state.observe(prompt, output);
      state.apply(got, pen);
      REQUIRE(got == want);
      output.push_back(id(rng));
    }
  }
}

TEST_CASE("top-p and min-p without top-k: the bucketed cut picks the reference's token on large rows") {
  // Flat rows (the kept prefix spans many buckets and ids), peaked ones (a few ids), and cuts that land
  // at the edge of the whole mass (top_p 0.999999, min_p 1e-30: the exact path's fallback).
  std::mt19937 rng(17);
  SamplerScratch scratch;
  int checked = 0;
  for (const float spread : {0.05f, 2.0f, 8.0f, 40.0f}) {
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> logits(32000);
    for (auto& l : logits) l = normal(rng);
    logits[100] = logits[31000];  // a tie across the row
    logits[7] = -std::numeric_limits<float>::infinity();
    for (const float t : {0.7f, 1.3f})
      for (const float top_p : {1.0f, 0.5f, 0.95f, 0.999999f})
        for (const float min_p : {0.0f, 0.1f, 1e-30f, 1.0f}) {
          if (top_p == 1.0f && min_p == 0.0f) continue;  // temperature alone: the test above
          SamplingParams p;
          p.temperature = t;
          p.top_p = top_p;
          p.min_p = min_p;
          for (std::uint64_t i = 0; i < 4; ++i) {
            p.seed = 131 * i + 5;
            CAPTURE(spread);
            CAPTURE(t);
            CAPTURE(top_p);
            CAPTURE(min_p);
            CAPTURE(i);
            REQUIRE(sample(logits, p, i, scratch) == sample_reference(logits, p, i));
            ++checked;
          }
        }
  }
  CHECK(checked == 4 * 2 * 15 * 4);
}

TEST_CASE("log_normalizer with the float exp stays within 1e-6 of a double log-sum-exp") {
  std::mt19937 rng(5);
  for (const float spread : {0.1f, 3.0f, 30.0f}) {
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> logits(50021);  // not a multiple of the 8 lanes
    for (auto& l : logits) l = normal(rng);
    logits[3] = -std::numeric_limits<float>::infinity();
    logits[4] = std::numeric_limits<float>::quiet_NaN();  // counts as -inf
    double max_l = -1e300;
    for (float l : logits)
      if (!std::isnan(l)) max_l = std::max(max_l, static_cast<double>(l));
    double sum = 0.0;
    for (float l : logits)
      if (!std::isnan(l)) sum += std::exp(static_cast<double>(l) - max_l);
    CAPTURE(spread);
    CHECK(std::abs(log_normalizer(logits) - (max_l + std::log(sum))) < 1e-6);
  }
}

TEST_CASE("top alternatives (logprobs) are a full sort's first k: descending, ties to the lower id, NaN last") {
  std::mt19937 rng(23);
  std::vector<float> logits(5000);
  for (auto& l : logits) l = static_cast<float>(static_cast<int>(rng() % 40)) * 0.25f - 5.0f;  // many ties
  logits[10] = -0.0f;
  logits[11] = 0.0f;
  logits[12] = std::numeric_limits<float>::quiet_NaN();
  logits[13] = -std::numeric_limits<float>::infinity();
  std::vector<TokenId> all(logits.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<TokenId>(i);
  auto key = [&](TokenId t) {
    const float l = logits[static_cast<std::size_t>(t)];
    return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l;
  };
  std::stable_sort(all.begin(), all.end(), [&](TokenId a, TokenId b) { return key(a) > key(b); });
  SamplerScratch scratch;
  std::vector<TokenLogprob> top;
  for (const int k : {1, 3, 20, 137, 5000}) {
    top_alternatives(logits, k, 0.0, scratch, top);
    REQUIRE(top.size() == static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) {
      CAPTURE(k);
      CAPTURE(i);
      CHECK(top[static_cast<std::size_t>(i)].id == all[static_cast<std::size_t>(i)]);
    }
  }
}
