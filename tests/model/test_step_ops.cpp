// The step without waste: the row-wise CPU ops split over the pool give the bits of the serial
// ops on any thread count, the pool's chunks are claimed by whichever thread is free, and a forward step
// of a shape seen before allocates nothing new (no page faults).
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

}  // namespace

TEST_CASE("row-wise ops split over the pool give the serial bits on 1, 2 and 3 threads") {
  const std::int64_t rows = 300, dim = 200, ff = 700, heads = 6, kv_heads = 2, head_dim = 32;
  const auto x = random_floats(rows * dim, 1), delta = random_floats(rows * dim, 2), w = random_floats(dim, 3);
  const auto gate = random_floats(rows * ff, 4), up = random_floats(rows * ff, 5);
  const auto q = random_floats(rows * heads * head_dim, 6), k = random_floats(rows * kv_heads * head_dim, 7);
  const auto v = random_floats(rows * kv_heads * head_dim, 8);
  std::vector<float> inv_freq(head_dim / 2);
  for (std::size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / head_dim);
  std::vector<std::int32_t> positions(rows);
  std::vector<std::int64_t> slots(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    positions[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 7) % 500);
    slots[static_cast<std::size_t>(r)] = (r * 37) % rows;  // a permutation: every slot written once
  }
  for (DType kv : {DType::f32, DType::bf16}) {
    cpu::KvLayer cache{nullptr, kv, 16, kv_heads, head_dim};
    const std::int64_t blocks = (rows + 15) / 16;
    auto run = [&](ThreadPool* pool) {
      std::vector<float> outs;
      auto add = [&](const std::vector<float>& o) { outs.insert(outs.end(), o.begin(), o.end()); };
      const cpu::WeightRef wr{w.data(), DType::f32};
      std::vector<float> n1(x.size()), res = x, n2(x.size()), g = gate, qq = q;
      std::vector<std::byte> storage(static_cast<std::size_t>(blocks * cache.block_elems()) * dtype_size(kv));
      cpu::KvLayer c = cache;
      c.base = storage.data();
      if (pool) {
        cpu::rms_norm(*pool, x.data(), rows, dim, wr, 1e-5f, n1.data());
        cpu::add_rms_norm(*pool, res.data(), delta.data(), rows, dim, wr, 1e-5f, n2.data());
        cpu::silu_mul(*pool, g.data(), up.data(), rows * ff);
        cpu::rope_store_kv(*pool, {inv_freq.data(), head_dim}, qq.data(), k.data(), v.data(), rows, heads,
                           positions.data(), slots.data(), c);
      } else {
        cpu::rms_norm(x.data(), rows, dim, wr, 1e-5f, n1.data());
        cpu::add_rms_norm(res.data(), delta.data(), rows, dim, wr, 1e-5f, n2.data());
        cpu::silu_mul(g.data(), up.data(), rows * ff);
        cpu::rope_store_kv({inv_freq.data(), head_dim}, qq.data(), k.data(), v.data(), rows, heads,
                           positions.data(), slots.data(), c);
      }
      add(n1), add(res), add(n2), add(g), add(qq);
      std::vector<float> kv_f(storage.size() / sizeof(float));
      std::memcpy(kv_f.data(), storage.data(), kv_f.size() * sizeof(float));
      add(kv_f);
      return outs;
    };
    const auto serial = run(nullptr);
    for (unsigned threads : {1u, 2u, 3u}) {
      ThreadPool pool(threads);
      CAPTURE(threads);
      CHECK(same_bits(run(&pool), serial));
      if (threads > 1) CHECK(pool.handoffs() >= 4);  // the shapes are large enough to be split
    }
  }
}

TEST_CASE("silu_mul's polynomial exp: within 3e-7 of the double silu, the same bits wherever an element falls") {
  // (libm's expf gave ~1e-7; the polynomial is within 2 ulp of it.)
  // Arguments across the whole range, the clamps (|g| > 87) and the exact values 0, +-1, +-88, +-100.
  std::vector<float> gate = random_floats(4099, 11), up = random_floats(4099, 12);
  for (std::size_t i = 0; i < gate.size(); i += 7) gate[i] *= 30.0f;
  const float special[] = {0.0f, 1.0f, -1.0f, 88.0f, -88.0f, 100.0f, -100.0f, 87.5f, -87.5f, 1e-30f};
  std::copy(std::begin(special), std::end(special), gate.begin());
  std::vector<float> out = gate;
  cpu::silu_mul(out.data(), up.data(), static_cast<std::int64_t>(out.size()));
  double worst = 0.0;
  for (std::size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
    CAPTURE(g);
    REQUIRE(std::isfinite(out[i]));
    if (g < -87.0) CHECK(std::abs(out[i]) < 1e-35);  // e^-g clamped at e^88: a value under 1e-35 for one of ~0
    else worst = std::max(worst, std::abs(out[i] - want) / std::max(std::abs(want), 1e-38));
  }
  CHECK(worst < 3e-7);
  // Element i computed at every offset of the 8-lane groups and in the padded tail gives the same bits.
  for (std::size_t first : {1u, 3u, 5u, 8u}) {
    std::vector<float> shifted(gate.begin() + static_cast<std::ptrdiff_t>(first), gate.end());
    cpu::silu_mul(shifted.data(), up.data() + first, static_cast<std::int64_t>(shifted.size()));
    CHECK(std::memcmp(shifted.data(), out.data() + first, shifted.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("rms_norm's 8 partial double sums: within 2e-7 of the double norm, any row length") {
  for (std::int64_t dim : {1, 7, 8, 13, 768, 1001}) {
    const auto x = random_floats(static_cast<std::size_t>(dim), 21), w = random_floats(static_cast<std::size_t>(dim), 22);
    std::vector<float> out(x.size());
    cpu::rms_norm(x.data(), 1, dim, {w.data(), DType::f32}, 1e-5f, out.data());
    double ss = 0.0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + 1e-5);
    CAPTURE(dim);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = x[i] * inv * w[i];
      CHECK(std::abs(out[i] - want) <= 2e-7 * std::abs(want) + 1e-30);
    }
  }
}

TEST_CASE("ThreadPool: a free thread takes the chunks of a busy one, every index once") {
  ThreadPool pool(2);
  std::vector<int> hits(64, 0);
  std::vector<std::thread::id> who(64);
  // The first chunk sleeps: the other thread must take every other chunk meanwhile (4 chunks a thread).
  pool.parallel_for(64, 8, [&](std::int64_t b, std::int64_t e) {
    if (b == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (std::int64_t i = b; i < e; ++i) {
      ++hits[static_cast<std::size_t>(i)];
      who[static_cast<std::size_t>(i)] = std::this_thread::get_id();
    }
  });
  for (int h : hits) REQUIRE(h == 1);
  // Chunk 0 (asleep) is 8 long; the other 56 indices ran on the other thread.
  for (std::size_t i = 0; i < 8; ++i) CHECK(who[i] == who[0]);
  for (std::size_t i = 8; i < 64; ++i) CHECK(who[i] != who[0]);
  CHECK(pool.handoffs() == 1);
  // One thread's worth of work (n / grain == 1): no hand-off.
  pool.parallel_for(10, 10, [&](std::int64_t, std::int64_t) {});
  CHECK(pool.handoffs() == 1);
}

TEST_CASE("a forward step of a shape seen before allocates nothing new: no page faults") {
  test::TempDir dir;
  MakeModelOptions o;
  o.dtype = DType::bf16;
  o.hidden = 256;
  o.intermediate = 768;
  o.heads = 8;
  o.kv_heads = 4;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  auto backend = make_cpu_backend(2);
  RunnerOptions ro;
  ro.num_blocks = 64;
  ro.max_batch_tokens = 256;
  ModelRunner runner(model, *backend, ro);
  std::vector<std::int32_t> table(32);
  std::iota(table.begin(), table.end(), 0);
  std::vector<TokenId> prompt(200);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>((i * 13 + 5) % 512);
  ForwardBatch prefill, decode;
  prefill.chunks.push_back({prompt, 0, table, SeqChunk::Logits::all});
  decode.chunks.push_back({std::span<const TokenId>(prompt).subspan(0, 1), 200, table, SeqChunk::Logits::last});
  // The first steps size the buffers, the runner's and each thread's own (attention's scratch grows in
  // whichever thread first runs a larger tile: the chunks go to whichever thread is free).
  for (int i = 0; i < 4; ++i) {
    runner.forward_view(prefill);
    runner.forward_view(decode);
  }
  // A thread that the warm-up happened to give no attention tile (the chunks go to whichever thread is
  // free first; with the AVX-512 kernel a prefill's tiles can all be gone before a slow worker wakes) grows
  // its scratch once, later. So: windows of 3 steps until one is free of faults, at most 4 (an allocation
  // per step would fault in every window).
  long faults = -1;
  for (int window = 0; window < 4 && faults != 0; ++window) {
    const long before = minor_faults();
    for (int i = 0; i < 3; ++i) {
      runner.forward_view(prefill);
      runner.forward_view(decode);
    }
    faults = minor_faults() - before;
    if (faults != 0) MESSAGE("window " << window << ": " << faults << " page faults");
  }
  CHECK(faults == 0);
}
