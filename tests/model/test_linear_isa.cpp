// cpu::linear on every instruction-set path this CPU has (forced in turn through set_cpu_isa): bit for bit
// equal to the scalar kernel, close to a float64 sum, and batch/thread/split invariant. Plus the thread
// pool's hand-off: every part runs exactly once per op, also after the workers fell asleep.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"

using namespace kvfleet;

namespace {

struct Weights {
  std::vector<std::uint8_t> bytes;
  std::vector<double> values;  // the weights as stored, widened
  DType dtype;
};

Weights random_weights(std::int64_t count, DType dt, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-0.5f, 0.5f);
  Weights w{std::vector<std::uint8_t>(static_cast<std::size_t>(count) * dtype_size(dt)), {}, dt};
  for (std::int64_t i = 0; i < count; ++i) {
    const float v = d(rng);
    if (dt == DType::f32) {
      std::memcpy(w.bytes.data() + i * 4, &v, 4);
    } else {
      const std::uint16_t h = dt == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(w.bytes.data() + i * 2, &h, 2);
    }
    w.values.push_back(load_as_f32(w.bytes.data(), dt, static_cast<std::size_t>(i)));
  }
  return w;
}

std::vector<float> random_x(std::int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = d(rng);
  return x;
}

std::vector<float> run(ThreadPool& pool, const std::vector<float>& x, std::int64_t rows, std::int64_t in,
                       const Weights& w, std::int64_t out, const Weights* bias) {
  std::vector<float> y(static_cast<std::size_t>(rows * out), -1.0f);
  cpu::linear(pool, x.data(), rows, in, {w.bytes.data(), w.dtype}, out,
              bias ? cpu::WeightRef{bias->bytes.data(), bias->dtype} : cpu::WeightRef{}, y.data());
  return y;
}

// The same product through pack_weight's layout only (the plain pointer null, so one row reads it too).
std::vector<float> run_packed(ThreadPool& pool, const std::vector<float>& x, std::int64_t rows, std::int64_t in,
                              const Weights& w, std::int64_t out, const Weights* bias) {
  std::vector<std::uint8_t> packed(cpu::packed_weight_bytes(out, in, w.dtype), 0xa5);
  cpu::pack_weight(w.bytes.data(), w.dtype, out, in, packed.data());
  std::vector<float> y(static_cast<std::size_t>(rows * out), -1.0f);
  cpu::linear(pool, x.data(), rows, in, {nullptr, w.dtype, packed.data()}, out,
              bias ? cpu::WeightRef{bias->bytes.data(), bias->dtype} : cpu::WeightRef{}, y.data());
  return y;
}

// The paths that compute linear_kernels.h's arithmetic (not the avx512bf16 mode).
std::vector<cpu::Isa> supported() {
  std::vector<cpu::Isa> v;
  for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512})
    if (cpu::cpu_supports(isa)) v.push_back(isa);
  return v;
}

struct IsaGuard {  // restores the process's choice after a test forced one
  cpu::Isa saved = cpu::cpu_isa();
  ~IsaGuard() { cpu::set_cpu_isa(saved); }
};

}  // namespace

TEST_CASE("linear: every ISA path is bit-identical to the scalar kernel and close to float64") {
  IsaGuard guard;
  INFO("chosen at load: " << cpu::isa_name(cpu::cpu_isa()));
  std::mt19937 rng(20);
  ThreadPool pool(2);
  struct Shape {
    std::int64_t rows, in, out;
  };
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (Shape s : {Shape{1, 1, 1}, Shape{1, 31, 9}, Shape{3, 32, 8}, Shape{5, 33, 17}, Shape{4, 768, 40},
                    Shape{70, 100, 33}, Shape{1, 2050, 70}, Shape{9, 64, 3},
                    // The prefetching 8-feature GEMV over whole tiles, and two 6-row tiles at K = 2048
                    // (both reduce four accumulators at once in the AVX-512 kernel).
                    Shape{1, 768, 200}, Shape{12, 2048, 24},
                    // More x than one row block of the AVX-512 GEMM (~1 MiB): tiles in two groups.
                    Shape{200, 2048, 20},
                    // The AVX2 segmented tiles (16 rows on): a segment of 32 blocks and a partial one (2),
                    // a plain row's tail, 3 x 3 tiles with 1 feature and 1 row left over.
                    Shape{40, 1100, 13}}) {
      const Weights w = random_weights(s.out * s.in, dt, rng), b = random_weights(s.out, dt, rng);
      const auto x = random_x(s.rows * s.in, rng);
      cpu::set_cpu_isa(cpu::Isa::scalar);
      const auto ref = run(pool, x, s.rows, s.in, w, s.out, &b);
      for (std::int64_t t = 0; t < s.rows; ++t)
        for (std::int64_t n = 0; n < s.out; ++n) {
          double sum = 0, mag = 0;
          for (std::int64_t k = 0; k < s.in; ++k) {
            const double p = static_cast<double>(x[static_cast<std::size_t>(t * s.in + k)]) * w.values[static_cast<std::size_t>(n * s.in + k)];
            sum += p;
            mag += std::fabs(p);
          }
          sum += b.values[static_cast<std::size_t>(n)];
          CHECK(std::fabs(ref[static_cast<std::size_t>(t * s.out + n)] - sum) <= 1e-6 * (mag + 1));
        }
      for (cpu::Isa isa : supported()) {
        CAPTURE(cpu::isa_name(isa));
        CAPTURE(dtype_name(dt));
        CAPTURE(s.rows);
        CAPTURE(s.in);
        CAPTURE(s.out);
        cpu::set_cpu_isa(isa);
        // AVX2's rows > 1: the 2 x 2 tile, the 3 x 2 tiles, and the default (3 x 3 segmented from 16 rows).
        for (int mode : isa == cpu::Isa::avx2 ? std::vector<int>{0, 1, 2} : std::vector<int>{2}) {
          CAPTURE(mode);
          cpu::detail::set_avx2_gemm(mode);
          CHECK(run(pool, x, s.rows, s.in, w, s.out, &b) == ref);
          CHECK(run_packed(pool, x, s.rows, s.in, w, s.out, &b) == ref);
        }
      }
    }
  }
}

TEST_CASE("linear: a row's bits do not depend on the batch, the thread count or linear_multi") {
  IsaGuard guard;
  std::mt19937 rng(7);
  ThreadPool one(1), two(2), three(3);
  const std::int64_t in = 768, out = 200, rows = 37;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Weights w = random_weights(out * in, dt, rng);
    const auto x = random_x(rows * in, rng);
    for (cpu::Isa isa : supported()) {
      CAPTURE(cpu::isa_name(isa));
      CAPTURE(dtype_name(dt));
      cpu::set_cpu_isa(isa);
      const auto all = run(two, x, rows, in, w, out, nullptr);
      CHECK(run(one, x, rows, in, w, out, nullptr) == all);
      CHECK(run(three, x, rows, in, w, out, nullptr) == all);
      CHECK(run_packed(one, x, rows, in, w, out, nullptr) == all);
      CHECK(run_packed(three, x, rows, in, w, out, nullptr) == all);
      for (std::int64_t r : {0, 5, 36}) {  // alone, and as part of a chunk of 6 rows
        const std::vector<float> xr(x.begin() + r * in, x.begin() + (r + 1) * in);
        const auto alone = run(two, xr, 1, in, w, out, nullptr);
        CHECK(std::equal(alone.begin(), alone.end(), all.begin() + r * out));
      }
      const std::vector<float> chunk(x.begin() + 30 * in, x.begin() + 36 * in);
      const auto part = run(two, chunk, 6, in, w, out, nullptr);
      CHECK(std::equal(part.begin(), part.end(), all.begin() + 30 * out));
      // Three projections of one x in one op: each as its own linear.
      std::vector<float> q(static_cast<std::size_t>(rows * 120)), k(static_cast<std::size_t>(rows * 8)),
          v(static_cast<std::size_t>(rows * 72));
      const auto* base = w.bytes.data();
      const std::size_t rb = static_cast<std::size_t>(in) * dtype_size(dt);
      std::vector<std::uint8_t> v_packed(cpu::packed_weight_bytes(72, in, dt));  // a packed part beside plain ones
      cpu::pack_weight(base + 128 * rb, dt, 72, in, v_packed.data());
      const cpu::LinearPart parts[] = {{{base, dt}, 120, {}, q.data()},
                                       {{base + 120 * rb, dt}, 8, {}, k.data()},
                                       {{base + 128 * rb, dt, v_packed.data()}, 72, {}, v.data()}};
      cpu::linear_multi(two, x.data(), rows, in, parts, 3);
      for (std::int64_t t = 0; t < rows; ++t) {
        const float* row = all.data() + t * out;
        CHECK(std::equal(q.begin() + t * 120, q.begin() + (t + 1) * 120, row));
        CHECK(std::equal(k.begin() + t * 8, k.begin() + (t + 1) * 8, row + 120));
        CHECK(std::equal(v.begin() + t * 72, v.begin() + (t + 1) * 72, row + 128));
      }
    }
  }
}

TEST_CASE("linear avx512bf16 mode: vdpbf16ps on bf16 x, batch/thread/layout invariant, near float64") {
  if (!cpu::cpu_supports(cpu::Isa::avx512bf16)) {
    MESSAGE("this CPU has no AVX-512 BF16: mode not tested");
    return;
  }
  IsaGuard guard;
  std::mt19937 rng(16);
  ThreadPool one(1), two(2);
  for (std::int64_t in : {768, 100, 31}) {
    const std::int64_t out = 45, rows = 23;
    CAPTURE(in);
    const Weights w = random_weights(out * in, DType::bf16, rng);
    const auto x = random_x(rows * in, rng);
    cpu::set_cpu_isa(cpu::Isa::avx512);
    const auto exact = run(two, x, rows, in, w, out, nullptr);
    cpu::set_cpu_isa(cpu::Isa::avx512bf16);
    const auto all = run(two, x, rows, in, w, out, nullptr);
    CHECK(run(one, x, rows, in, w, out, nullptr) == all);
    CHECK(run_packed(two, x, rows, in, w, out, nullptr) == all);
    for (std::int64_t r : {0, 22}) {
      const std::vector<float> xr(x.begin() + r * in, x.begin() + (r + 1) * in);
      const auto alone = run_packed(one, xr, 1, in, w, out, nullptr);
      CHECK(std::equal(alone.begin(), alone.end(), all.begin() + r * out));
    }
    // Against float64 with x rounded to bf16 (what the mode computes), and against the exact path: the
    // rounding of x moves each product by up to 2^-9 of itself.
    double worst = 0;
    for (std::int64_t t = 0; t < rows; ++t)
      for (std::int64_t n = 0; n < out; ++n) {
        double sum = 0, mag = 0;
        for (std::int64_t k = 0; k < in; ++k) {
          const float xk = bf16_to_f32(f32_to_bf16(x[static_cast<std::size_t>(t * in + k)]));
          const double p = static_cast<double>(xk) * w.values[static_cast<std::size_t>(n * in + k)];
          sum += p;
          mag += std::fabs(p);
        }
        const auto i = static_cast<std::size_t>(t * out + n);
        CHECK(std::fabs(all[i] - sum) <= 1e-5 * (mag + 1));
        CHECK(std::fabs(all[i] - exact[i]) <= 4e-3 * (mag + 1));
        worst = std::max(worst, std::fabs(all[i] - exact[i]) / (mag + 1));
      }
    MESSAGE("in " << in << ": largest |bf16 mode - exact| / (sum |x w| + 1) = " << worst);
    // Other weight dtypes run the exact avx512 kernel in this mode.
    const Weights wf = random_weights(out * in, DType::f16, rng);
    const auto f16_mode = run(two, x, rows, in, wf, out, nullptr);
    cpu::set_cpu_isa(cpu::Isa::avx512);
    CHECK(run(two, x, rows, in, wf, out, nullptr) == f16_mode);
  }
}

TEST_CASE("cpu_isa: the best path is chosen on this CPU and an unsupported one is refused") {
  IsaGuard guard;
  CHECK(cpu::cpu_supports(cpu::Isa::scalar));
  if (cpu::cpu_supports(cpu::Isa::avx512) && !std::getenv("KVFLEET_CPU_ISA")) CHECK(guard.saved == cpu::Isa::avx512);
  for (cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::avx512})
    if (!cpu::cpu_supports(isa)) CHECK_THROWS_AS(cpu::set_cpu_isa(isa), std::invalid_argument);
}

TEST_CASE("ThreadPool: every part runs exactly once per op, spinning or after the workers slept") {
  for (unsigned threads : {1u, 2u, 4u}) {
    ThreadPool pool(threads);
    std::vector<int> hits(1000, 0);
    for (int op = 0; op < 300; ++op) {
      const std::int64_t n = 1 + (op * 37) % 1000;
      pool.parallel_for(n, 1 + op % 7, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) ++hits[static_cast<std::size_t>(i)];
      });
      for (std::int64_t i = 0; i < 1000; ++i) {
        const int want = i < n ? 1 : 0;
        if (hits[static_cast<std::size_t>(i)] != want) FAIL("op " << op << " index " << i << " ran " << hits[static_cast<std::size_t>(i)] << "x");
        hits[static_cast<std::size_t>(i)] = 0;
      }
      if (op % 50 == 0)  // longer than the spin: the workers sleep on the futex and must wake
        std::this_thread::sleep_for(ThreadPool::spin_time() * 3 + std::chrono::microseconds(100));
    }
  }
}

// The pool notifies only a thread that sleeps (sleepers_, caller_sleeps_): every way of falling asleep
// must still be woken, with another pool's workers asleep in the process (what made every notify a
// system call before). Each op has two chunks and the caller's waits until a worker has taken the other
// (a worker never woken fails that wait); pauses between ops from half to twice the spin time put the
// worker to sleep just as ops come; and in some ops the worker's chunk outlasts the caller's spin, so the
// caller sleeps until the worker ends it (never woken, it would hang: a watchdog fails the test instead).
TEST_CASE("ThreadPool: ops wake sleeping workers and a sleeping caller, with another pool asleep beside") {
  ThreadPool idle(3);
  idle.parallel_for(3, 1, [](std::int64_t, std::int64_t) {});  // then its workers sleep on their own word
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !finished.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!finished.load()) {
      std::fprintf(stderr, "ThreadPool test: no progress in 30 s, a lost wake-up\n");
      std::_Exit(1);
    }
  });
  {
    ThreadPool pool(2);
    const auto spin = ThreadPool::spin_time();
    const auto caller = std::this_thread::get_id();
    int worker_missing = 0;
    for (int op = 0; op < 300; ++op) {
      const bool long_chunk = op % 10 == 3;
      std::atomic<bool> taken{false};
      std::atomic<int> hits[2] = {0, 0};
      pool.parallel_for(2, 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) ++hits[i];
        if (std::this_thread::get_id() != caller) {
          taken.store(true);
          if (long_chunk) std::this_thread::sleep_for(spin * 2 + std::chrono::microseconds(500));
          return;
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!taken.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        if (!taken.load()) ++worker_missing;
      });
      REQUIRE(hits[0].load() == 1);
      REQUIRE(hits[1].load() == 1);
      std::this_thread::sleep_for(spin * (1 + op % 4) / 2);
    }
    CHECK(worker_missing == 0);
    CHECK(pool.handoffs() == 300);
  }
  finished.store(true);
  watchdog.join();
}

TEST_CASE("ThreadPool::parallel_for_tapered: every index once, chunks that shrink to the tail, fixed boundaries") {
  for (unsigned threads : {2u, 3u}) {
    ThreadPool pool(threads);
    for (std::int64_t n : {7, 160, 4000, 100000}) {
      for (std::int64_t tail : {1, 8, 50}) {
        CAPTURE(threads);
        CAPTURE(n);
        CAPTURE(tail);
        std::vector<int> hits(static_cast<std::size_t>(n), 0);
        std::vector<std::pair<std::int64_t, std::int64_t>> chunks[2];
        for (auto& seen : chunks) {
          std::mutex m;
          pool.parallel_for_tapered(n, 2, tail, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) ++hits[static_cast<std::size_t>(i)];
            const std::lock_guard<std::mutex> lock(m);
            seen.emplace_back(b, e);
          });
          std::sort(seen.begin(), seen.end());
        }
        for (int h : hits) REQUIRE(h == 2);
        CHECK(chunks[0] == chunks[1]);  // the boundaries do not depend on which thread ran what
        const auto& c = chunks[0];
        REQUIRE(c.front().first == 0);
        REQUIRE(c.back().second == n);
        for (std::size_t i = 0; i + 1 < c.size(); ++i) {
          CHECK(c[i].second == c[i + 1].first);
          CHECK(c[i].second - c[i].first >= std::min(tail, n));  // only the last may be shorter
          CHECK(c[i].second - c[i].first >= c[i + 1].second - c[i + 1].first);  // shrinking
        }
        CHECK(c.size() <= static_cast<std::size_t>(ThreadPool::kMaxChunks));
        // The first chunk is 1 / (2 x threads) of the range (or the tail): the rest is cut ever finer.
        CHECK(c.front().second == std::min(n, std::max(tail, n / (2 * std::min<std::int64_t>(threads, n / 2)))));
      }
    }
  }
}

TEST_CASE("linear: one row's bits do not depend on tapered or equal chunks or the thread count") {
  IsaGuard guard;
  std::mt19937 rng(11);
  ThreadPool one(1), two(2), three(3);
  const std::int64_t in = 768, out = 3000;  // 375 panels: the GEMV is split (tapered by default)
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Weights w = random_weights(out * in, dt, rng);
    for (std::int64_t rows : {1, 3, 8}) {
      const auto x = random_x(rows * in, rng);
      for (cpu::Isa isa : supported()) {
        CAPTURE(cpu::isa_name(isa));
        CAPTURE(dtype_name(dt));
        CAPTURE(rows);
        cpu::set_cpu_isa(isa);
        const auto ref = run(one, x, rows, in, w, out, nullptr);
        const std::uint64_t before = two.handoffs();
        CHECK(run(two, x, rows, in, w, out, nullptr) == ref);
        CHECK(two.handoffs() == before + 1);  // it was split
        CHECK(run_packed(two, x, rows, in, w, out, nullptr) == ref);
        CHECK(run_packed(three, x, rows, in, w, out, nullptr) == ref);
        cpu::detail::set_tapered_split(false);
        CHECK(run(two, x, rows, in, w, out, nullptr) == ref);
        CHECK(run_packed(three, x, rows, in, w, out, nullptr) == ref);
        cpu::detail::set_tapered_split(true);
      }
    }
  }
}

TEST_CASE("linear_multi: more parts than one call holds (6) run in groups, each part equal to its own linear") {
  std::mt19937 rng(5);
  ThreadPool two(2);
  const std::int64_t in = 256, rows = 3;
  const std::int64_t outs[6] = {24, 8, 40, 16, 64, 9};
  std::vector<Weights> w;
  for (std::int64_t o : outs) w.push_back(random_weights(o * in, DType::bf16, rng));
  const auto x = random_x(rows * in, rng);
  std::vector<std::vector<float>> y(6);
  std::vector<cpu::LinearPart> parts;
  for (std::size_t p = 0; p < 6; ++p) {
    y[p].assign(static_cast<std::size_t>(rows * outs[p]), -1.0f);
    parts.push_back({{w[p].bytes.data(), DType::bf16}, outs[p], {}, y[p].data()});
  }
  cpu::linear_multi(two, x.data(), rows, in, parts.data(), 6);
  for (std::size_t p = 0; p < 6; ++p) CHECK(y[p] == run(two, x, rows, in, w[p], outs[p], nullptr));
}

namespace {

// One row on packed panels through `isa`, once per variant (set_variant(v) before the call, v < variants),
// on 1-3 threads; f32 / bf16 / f16, K with and without a partial block, odd and even panel counts per
// thread, partial last panels: the scalar kernel's bits, and nothing written past y.
template <class SetVariant>
void check_packed_gemv(cpu::Isa isa, std::uint32_t seed, int variants, SetVariant set_variant) {
  std::mt19937 rng(seed);
  ThreadPool one(1), two(2), three(3);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (std::int64_t in : {1, 31, 64, 768, 2050}) {
      for (std::int64_t out : {1, 7, 9, 17, 40, 200, 1003}) {
        const Weights w = random_weights(out * in, dt, rng);
        const auto x = random_x(in, rng);
        cpu::set_cpu_isa(cpu::Isa::scalar);
        const auto ref = run(one, x, 1, in, w, out, nullptr);
        cpu::set_cpu_isa(isa);
        std::vector<std::uint8_t> packed(cpu::packed_weight_bytes(out, in, dt));
        cpu::pack_weight(w.bytes.data(), dt, out, in, packed.data());
        for (int v = 0; v < variants; ++v)
          for (ThreadPool* pool : {&one, &two, &three}) {
            CAPTURE(dtype_name(dt));
            CAPTURE(in);
            CAPTURE(out);
            CAPTURE(v);
            CAPTURE(pool->size());
            set_variant(v);
            std::vector<float> y(static_cast<std::size_t>(out) + 16, -7.0f);  // 16 sentinels after y
            cpu::linear(*pool, x.data(), 1, in, {nullptr, dt, packed.data()}, out, {}, y.data());
            CHECK(std::equal(ref.begin(), ref.end(), y.begin()));
            CHECK(std::all_of(y.begin() + out, y.end(), [](float f) { return f == -7.0f; }));
          }
      }
    }
  }
}

}  // namespace

TEST_CASE("linear: the AVX2 GEMV's two passes a panel give the tile's bits, writing only y") {
  // set_avx2_gemv: -1 the 2 x 2 tile; 0 two passes of 4 features a panel; 8 the same, the first pass
  // prefetching 8 blocks ahead.
  if (!cpu::cpu_supports(cpu::Isa::avx2)) return;
  IsaGuard guard;
  const int saved = cpu::detail::avx2_gemv();
  check_packed_gemv(cpu::Isa::avx2, 13, 3, [](int v) {
    const int ahead = std::array{-1, 0, 8}[static_cast<std::size_t>(v)];
    cpu::detail::set_avx2_gemv(ahead);
    CHECK(cpu::detail::avx2_gemv() == ahead);
  });
  cpu::detail::set_avx2_gemv(saved);
}

TEST_CASE("linear: the packed GEMV reads the panels in any pattern with the same bits, writing only y") {
  // streams 0: the GEMV as an 8-feature tile; 1 and 2: a panel at a time, one or two panels side by side
  // (linear_avx512.cpp, chosen per CPU at load); each with and without software prefetch (variant v:
  // streams v / 2, L1 prefetch 4 blocks ahead and L2 16 when v is odd).
  if (!cpu::cpu_supports(cpu::Isa::avx512)) return;
  IsaGuard guard;
  std::uint32_t saved[3];
  cpu::detail::packed_gemv(saved[0], saved[1], saved[2]);
  check_packed_gemv(cpu::Isa::avx512, 12, 6, [](int v) {
    const std::uint32_t l1 = v % 2 ? 4 : 0;
    cpu::detail::set_packed_gemv(static_cast<std::uint32_t>(v / 2), l1, l1 ? 16 : 0);
  });
  cpu::detail::set_packed_gemv(saved[0], saved[1], saved[2]);
}
