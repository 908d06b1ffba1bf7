// The sampler's row passes (AVX-512, AVX2 and generic: the same bits) and its bucketed paths (top-k selection,
// the two-bucket top-p draw): each agrees exactly with the reference on every path.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/sample/buckets.h"
#include "engine/sample/scan.h"
#include "engine/sample/weights.h"
#include "kvfleet/sampler.h"

using namespace kvfleet;
namespace sd = kvfleet::sampler_detail;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A row of `n` normal logits of std `spread`, with the awkward values a model or a mask can produce.
std::vector<float> awkward_row(std::size_t n, float spread, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> row(n);
  for (auto& l : row) l = normal(rng);
  if (n > 8) {
    row[1] = -0.0f;
    row[2] = 0.0f;
    row[3] = -kInf;
    row[4] = std::numeric_limits<float>::quiet_NaN();
    row[n - 1] = row[n / 2];  // a tie across the row
  }
  return row;
}

// Runs `fn` once on each scan path this CPU has (generic, AVX2, AVX-512), restoring the automatic choice.
template <class Fn>
void on_each_path(Fn&& fn) {
  const sd::ScanPath automatic = sd::scan_path();
  for (const sd::ScanPath path : {sd::ScanPath::generic, sd::ScanPath::avx2, sd::ScanPath::avx512}) {
    if (!sd::scan_path_supported(path)) {
      MESSAGE("this CPU lacks a scan path's instructions (" << static_cast<int>(path) << "): it did not run");
      continue;
    }
    sd::set_scan_path(path);
    CAPTURE(static_cast<int>(path));
    fn();
  }
  sd::set_scan_path(automatic);
}

struct Scan {
  sd::Range range{};
  std::vector<float> w;
  std::vector<std::uint16_t> bucket, count_bucket;
  std::vector<double> sum;
  std::vector<std::uint32_t> count;
  std::vector<TokenId> collected;
  std::size_t first = 0;
};

Scan scan(const std::vector<float>& row, float t) {
  Scan s;
  s.range = sd::row_range(row);
  const sd::Bucketing g = sd::make_bucketing(s.range, t);
  s.w.resize(row.size());
  s.bucket.resize(row.size());
  s.count_bucket.resize(row.size());
  s.sum.resize(sd::kBuckets);
  s.count.resize(sd::kBuckets);
  sd::weigh_and_bucket(row, g, s.w.data(), s.bucket.data(), s.sum.data());
  sd::count_buckets(row, g, s.count_bucket.data(), s.count.data());
  sd::collect_buckets(s.bucket.data(), row.size(), 3, 40, s.collected);
  s.first = sd::first_equal(row, s.range.max);
  return s;
}

// One seeded draw of a fast path `draw` (top-p's two-bucket draw, min-p's zone draw) against the reference:
// the reference's token or a decline (< 0), counted; and sample() always picks the reference's token.
template <class Draw>
void check_draw(const std::vector<float>& row, const SamplingParams& p, std::uint64_t i, SamplerScratch& scratch,
                Draw draw, int& decided, int& declined) {
  const TokenId want = sample_reference(row, p, i);
  const TokenId got = draw(row, p, i, scratch);
  if (got < 0) {
    ++declined;
  } else {
    ++decided;
    REQUIRE(got == want);
  }
  REQUIRE(sample(row, p, i, scratch) == want);
}

}  // namespace

TEST_CASE("the AVX-512 and AVX2 row passes give the generic passes' bits, and the weights are weight()'s") {
  std::mt19937 rng(23);
  int rows = 0;
  for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{17}, std::size_t{33}, std::size_t{1000},
                              std::size_t{8193}}) {
    for (const float spread : {0.01f, 2.0f, 40.0f}) {
      const std::vector<float> row = n == 1 ? std::vector<float>{0.5f} : awkward_row(n, spread, rng);
      for (const float t : {0.3f, 1.0f, 2.5f}) {
        CAPTURE(n);
        CAPTURE(spread);
        CAPTURE(t);
        std::vector<Scan> got;
        on_each_path([&] { got.push_back(scan(row, t)); });
        const Scan& a = got.front();
        for (std::size_t i = 0; i < n; ++i) {
          const float want = sd::scalar_weight(row[i], a.range.max, t);
          REQUIRE(std::bit_cast<std::uint32_t>(a.w[i]) == std::bit_cast<std::uint32_t>(want));
        }
        // Bucket order follows the logit order (a larger logit never gets a later bucket).
        std::vector<std::size_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
          return sd::ordered(row[x]) > sd::ordered(row[y]);
        });
        for (std::size_t i = 1; i < n; ++i) REQUIRE(a.bucket[order[i - 1]] <= a.bucket[order[i]]);
        CHECK(a.first < n);
        CHECK(row[a.first] == a.range.max);
        for (const Scan& b : got) {
          CHECK(std::bit_cast<std::uint32_t>(b.range.max) == std::bit_cast<std::uint32_t>(a.range.max));
          CHECK(std::bit_cast<std::uint32_t>(b.range.min) == std::bit_cast<std::uint32_t>(a.range.min));
          REQUIRE(std::equal(b.w.begin(), b.w.end(), a.w.begin(), [](float x, float y) {
            return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
          }));
          CHECK(b.bucket == a.bucket);
          CHECK(b.count_bucket == a.bucket);
          CHECK(b.sum == a.sum);
          CHECK(b.count == a.count);
          CHECK(b.collected == a.collected);
          CHECK(b.first == a.first);
        }
        ++rows;
      }
    }
  }
  CHECK(rows == 6 * 3 * 3);
}

TEST_CASE("top-k selection gives a full sort's first k (ties to the lower id, NaN as -inf, constant rows)") {
  std::mt19937 rng(29);
  SamplerScratch scratch;
  on_each_path([&] {
    for (const float spread : {0.0f, 0.001f, 3.0f, 300.0f}) {
      std::vector<float> row = awkward_row(5000, spread == 0.0f ? 1.0f : spread, rng);
      if (spread == 0.0f) std::fill(row.begin(), row.end(), 1.25f);  // every id ties
      std::vector<TokenId> all(row.size());
      std::iota(all.begin(), all.end(), 0);
      std::sort(all.begin(), all.end(), sd::ByLogit{row});
      for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{50}, std::size_t{4999}}) {
        CAPTURE(spread);
        CAPTURE(k);
        sd::select_top_k(row, k, scratch);
        REQUIRE(scratch.ids.size() >= k);
        CHECK(std::equal(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), scratch.ids.begin()));
      }
    }
  });
}

TEST_CASE("top-p alone: the two-bucket draw picks the reference's token or declines, and seldom declines") {
  std::mt19937 rng(31);
  SamplerScratch scratch;
  int decided = 0, declined = 0;
  for (const float spread : {0.05f, 0.5f, 2.0f, 8.0f, 400.0f}) {
    const std::vector<float> row = awkward_row(8192, spread, rng);
    for (const float t : {0.3f, 0.7f, 1.0f, 1.7f})
      for (const float top_p : {0.05f, 0.5f, 0.9f, 0.95f, 0.999999f}) {
        SamplingParams p;
        p.temperature = t;
        p.top_p = top_p;
        for (std::uint64_t i = 0; i < 6; ++i) {
          p.seed = 7919 * i + 3;
          CAPTURE(spread);
          CAPTURE(t);
          CAPTURE(top_p);
          CAPTURE(i);
          check_draw(row, p, i, scratch, sd::draw_top_p, decided, declined);
        }
      }
  }
  MESSAGE("two-bucket top-p: " << decided << " decided, " << declined << " left to the exact paths");
  CHECK(decided + declined == 5 * 4 * 5 * 6);
  CHECK(declined * 10 < decided);  // top_p 0.999999 is within rounding of the whole mass on flat rows
}

TEST_CASE("min-p alone: the zone draw picks the reference's token or declines, and seldom declines") {
  std::mt19937 rng(41);
  SamplerScratch scratch;
  int decided = 0, declined = 0;
  on_each_path([&] {
    for (const float spread : {0.05f, 0.5f, 2.0f, 8.0f, 400.0f}) {
      const std::vector<float> row = awkward_row(8192, spread, rng);
      for (const float t : {0.3f, 1.0f, 1.7f})
        for (const float min_p : {1e-30f, 0.001f, 0.05f, 0.5f, 0.99f, 1.0f}) {
          SamplingParams p;
          p.temperature = t;
          p.min_p = min_p;
          for (std::uint64_t i = 0; i < 5; ++i) {
            p.seed = 6151 * i + 11;
            CAPTURE(spread);
            CAPTURE(t);
            CAPTURE(min_p);
            CAPTURE(i);
            check_draw(row, p, i, scratch, sd::draw_min_p, decided, declined);
          }
        }
    }
  });
  MESSAGE("zone min-p: " << decided << " decided, " << declined << " left to the exact paths");
  CHECK(declined * 10 < decided);  // min_p 1e-30 (a cut below the buckets' range) is left to the prefix path
}

// A min-p cut exactly at an id's weight: the reference keeps it (>=); the zone walk must decline or agree.
TEST_CASE("min-p at an id's own weight, and a row whose kept ids are almost all of it") {
  SamplerScratch scratch;
  std::vector<float> row(4096);
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = -0.001f * static_cast<float>(i % 97);
  SamplingParams p;
  p.min_p = sd::scalar_weight(row[40], 0.0f, 1.0f);  // exactly id 40's weight
  for (std::uint64_t i = 0; i < 40; ++i) {
    p.seed = i;
    CAPTURE(i);
    REQUIRE(sample(row, p, i, scratch) == sample_reference(row, p, i));
  }
  p.min_p = 0.5f;  // every id kept (weights >= e^-0.096)
  for (std::uint64_t i = 0; i < 40; ++i) {
    p.seed = i;
    REQUIRE(sample(row, p, i, scratch) == sample_reference(row, p, i));
    REQUIRE(sd::draw_min_p(row, p, i, scratch) == sample_reference(row, p, i));
  }
}

TEST_CASE("sample() picks the reference's token on both scan paths, in every mode a chat user runs") {
  std::mt19937 rng(37);
  int checked = 0;
  on_each_path([&] {
    SamplerScratch scratch;
    for (const std::size_t vocab : {std::size_t{300}, std::size_t{32000}}) {
      for (const float spread : {0.5f, 3.0f, 30.0f}) {
        const std::vector<float> row = awkward_row(vocab, spread, rng);
        struct Mode {
          float t, top_p, min_p;
          std::int32_t top_k;
        };
        for (const Mode m : {Mode{0.0f, 1.0f, 0.0f, 0}, Mode{1.0f, 1.0f, 0.0f, 0}, Mode{0.7f, 0.9f, 0.0f, 0},
                             Mode{1.0f, 1.0f, 0.0f, 50}, Mode{0.8f, 0.95f, 0.0f, 40}, Mode{1.0f, 1.0f, 0.05f, 0},
                             Mode{0.6f, 0.8f, 0.02f, 100}}) {
          SamplingParams p;
          p.temperature = m.t;
          p.top_p = m.top_p;
          p.min_p = m.min_p;
          p.top_k = m.top_k;
          for (std::uint64_t i = 0; i < 8; ++i) {
            p.seed = 104729 * i + 1;
            CAPTURE(vocab);
            CAPTURE(spread);
            CAPTURE(m.t);
            CAPTURE(m.top_p);
            CAPTURE(m.min_p);
            CAPTURE(m.top_k);
            REQUIRE(sample(row, p, i, scratch) == sample_reference(row, p, i));
            ++checked;
          }
        }
      }
    }
  });
  CHECK(checked >= 2 * 3 * 7 * 8);
}
