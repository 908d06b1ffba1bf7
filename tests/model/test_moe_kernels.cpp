// The CPU MoE kernels: routing by hand, the grouped expert path against a token-by-token computation,
// and batch invariance (a row's bits do not depend on the other rows).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/moe.h"

using namespace kvfleet;

namespace {

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Experts {
  std::int64_t e, h, i;
  std::vector<std::vector<float>> gate, up, down;
  std::vector<cpu::ExpertRef> refs;
  Experts(std::int64_t e_, std::int64_t h_, std::int64_t i_, std::mt19937& rng) : e(e_), h(h_), i(i_) {
    for (std::int64_t k = 0; k < e; ++k) {
      gate.push_back(random_vector(static_cast<std::size_t>(i * h), rng, 0.3f));
      up.push_back(random_vector(static_cast<std::size_t>(i * h), rng, 0.3f));
      down.push_back(random_vector(static_cast<std::size_t>(h * i), rng, 0.3f));
    }
    for (std::int64_t k = 0; k < e; ++k)
      refs.push_back({{gate[k].data(), DType::f32}, {up[k].data(), DType::f32}, {down[k].data(), DType::f32}});
  }
};

}  // namespace

TEST_CASE("moe_route: softmax, top-k in descending order, ties to the lower id, renormalisation") {
  const float logits[] = {0.0f, std::log(2.0f), std::log(3.0f), 0.0f,   // probs 1/7, 2/7, 3/7, 1/7
                          1.0f, 1.0f, 1.0f, 1.0f};                    // all equal
  std::int32_t ids[4];
  float w[4];
  cpu::moe_route(logits, 2, 4, 2, false, ids, w);
  CHECK(ids[0] == 2);
  CHECK(ids[1] == 1);
  CHECK(w[0] == doctest::Approx(3.0 / 7).epsilon(1e-6));
  CHECK(w[1] == doctest::Approx(2.0 / 7).epsilon(1e-6));
  CHECK(ids[2] == 0);
  CHECK(ids[3] == 1);
  CHECK(w[2] == doctest::Approx(0.25).epsilon(1e-6));
  cpu::moe_route(logits, 2, 4, 2, true, ids, w);
  CHECK(w[0] == doctest::Approx(0.6).epsilon(1e-6));
  CHECK(w[1] == doctest::Approx(0.4).epsilon(1e-6));
  CHECK(w[2] == doctest::Approx(0.5).epsilon(1e-6));
}

TEST_CASE("moe_experts equals the token-by-token sum, and counts tokens per expert") {
  std::mt19937 rng(3);
  const std::int64_t rows = 9, h = 24, inter = 20, e = 5, k = 2;
  Experts ex(e, h, inter, rng);
  const auto x = random_vector(static_cast<std::size_t>(rows * h), rng);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows * k));
  std::vector<float> w(ids.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    ids[static_cast<std::size_t>(r * k)] = static_cast<std::int32_t>(r % e);
    ids[static_cast<std::size_t>(r * k + 1)] = static_cast<std::int32_t>((r * 3 + 1) % e == r % e ? (r + 1) % e : (r * 3 + 1) % e);
    w[static_cast<std::size_t>(r * k)] = 0.7f;
    w[static_cast<std::size_t>(r * k + 1)] = 0.3f;
  }
  ThreadPool pool(2);
  cpu::MoeScratch scratch;
  std::vector<float> out(static_cast<std::size_t>(rows * h));
  std::vector<std::int32_t> counts(static_cast<std::size_t>(e), 0);
  cpu::moe_experts(pool, scratch, x.data(), rows, h, inter, ids.data(), w.data(), k, ex.refs.data(), e, out.data(),
                   counts.data());
  std::vector<std::int32_t> want_counts(static_cast<std::size_t>(e), 0);
  for (auto id : ids) ++want_counts[static_cast<std::size_t>(id)];
  CHECK(counts == want_counts);
  double max_err = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<double> acc(static_cast<std::size_t>(h), 0.0);
    for (std::int64_t j = 0; j < k; ++j) {
      const auto id = static_cast<std::size_t>(ids[static_cast<std::size_t>(r * k + j)]);
      std::vector<double> a(static_cast<std::size_t>(inter));
      for (std::int64_t n = 0; n < inter; ++n) {
        double g = 0, u = 0;
        for (std::int64_t c = 0; c < h; ++c) {
          g += double(ex.gate[id][static_cast<std::size_t>(n * h + c)]) * x[static_cast<std::size_t>(r * h + c)];
          u += double(ex.up[id][static_cast<std::size_t>(n * h + c)]) * x[static_cast<std::size_t>(r * h + c)];
        }
        a[static_cast<std::size_t>(n)] = g / (1 + std::exp(-g)) * u;
      }
      for (std::int64_t c = 0; c < h; ++c) {
        double y = 0;
        for (std::int64_t n = 0; n < inter; ++n) y += double(ex.down[id][static_cast<std::size_t>(c * inter + n)]) * a[static_cast<std::size_t>(n)];
        acc[static_cast<std::size_t>(c)] += w[static_cast<std::size_t>(r * k + j)] * y;
      }
    }
    for (std::int64_t c = 0; c < h; ++c)
      max_err = std::max(max_err, std::abs(acc[static_cast<std::size_t>(c)] - out[static_cast<std::size_t>(r * h + c)]));
  }
  CHECK(max_err < 1e-5);
}

TEST_CASE("moe_experts is batch-invariant: each row alone gives the same bits as in the batch") {
  std::mt19937 rng(11);
  const std::int64_t rows = 13, h = 40, inter = 36, e = 6, k = 3;  // not multiples of 16: tails too
  Experts ex(e, h, inter, rng);
  const auto x = random_vector(static_cast<std::size_t>(rows * h), rng);
  const auto logits = random_vector(static_cast<std::size_t>(rows * e), rng, 2.0f);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows * k));
  std::vector<float> w(ids.size());
  cpu::moe_route(logits.data(), rows, e, k, true, ids.data(), w.data());
  ThreadPool pool(2);
  cpu::MoeScratch scratch;
  std::vector<float> batched(static_cast<std::size_t>(rows * h));
  cpu::moe_experts(pool, scratch, x.data(), rows, h, inter, ids.data(), w.data(), k, ex.refs.data(), e, batched.data(),
                   nullptr);
  ThreadPool one(1);
  for (std::int64_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    std::vector<std::int32_t> id1(static_cast<std::size_t>(k));
    std::vector<float> w1(static_cast<std::size_t>(k)), alone(static_cast<std::size_t>(h));
    cpu::moe_route(logits.data() + r * e, 1, e, k, true, id1.data(), w1.data());
    CHECK(std::equal(id1.begin(), id1.end(), ids.begin() + r * k));
    cpu::moe_experts(one, scratch, x.data() + r * h, 1, h, inter, id1.data(), w1.data(), k, ex.refs.data(), e,
                     alone.data(), nullptr);
    CHECK(std::memcmp(alone.data(), batched.data() + r * h, static_cast<std::size_t>(h) * sizeof(float)) == 0);
  }
}

TEST_CASE("sigmoid_scale_add gates each row by its own scalar") {
  float acc[4] = {1, 1, 1, 1};
  const float x[4] = {2, 4, 6, 8};
  const float gate[2] = {0.0f, 100.0f};
  cpu::sigmoid_scale_add(acc, x, gate, 2, 2);
  CHECK(acc[0] == doctest::Approx(2.0));
  CHECK(acc[1] == doctest::Approx(3.0));
  CHECK(acc[2] == doctest::Approx(7.0));
  CHECK(acc[3] == doctest::Approx(9.0));
}
