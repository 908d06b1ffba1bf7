// CPU paged attention, the kernel before the vectorised one (scalar, two passes, K/V re-read for every query head of
// a GQA group; copied below verbatim) against kernels/cpu/paged_attention.cpp, interleaved in one run
// (old, new, old, new, ...) so that a loaded machine slows both alike. Shapes: a 125M llama's attention
// (12 query heads, 4 kv heads, head_dim 64, block 16).
//
//   build/bin/bench_attention [--threads 2] [--reps 5] [--4k] [--cpu-time] [--new-only] [--prefill-only]
//                             [--layers N] [--ahead 0,1,2]
//   decode: 32 sequences x context 64 and 512, 1 x 512, 8 x 4096; prefill: one 512-token prompt (causal),
//   with --4k also one 4096-token prompt (new kernel only); new with fp32/bf16 KV. --new-only leaves the old
//   kernel out, --prefill-only the decode shapes (for profiling). --layers N: N caches, each timed call runs
//   them all (a step's layers: the KV no longer stays in the caches from one call to the next, as in a
//   model); --ahead: the new kernel only, with each listed prefetch distance in turn
//   (set_attention_prefetch_blocks), each transposing K per block and reading K's transposed copy
//   (KvLayer::kt, as the CPU backend keeps it), and the fp32 decode's K/V read rate. The new kernel runs on the
//   instruction set cpu_isa() chose (KVFLEET_CPU_ISA=avx2 forces the AVX2 one). The caches are on 2 MiB
//   pages as the CPU backend's are (HugePageArena; KVFLEET_CPU_HUGEPAGES=0: small pages, for A/B runs).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend/cpu/huge_page_arena.h"
#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/ops.h"

using namespace kvfleet;
using cpu::AttnRow;

namespace old_kernel {

void attend(const float* q, const AttnRow& row, std::int64_t kv_head, const cpu::KvLayer& c, float scale,
            std::vector<float>& scores, float* out) {
  const std::int64_t n = row.position + 1, d = c.head_dim;
  auto k_at = [&](std::int64_t j) { return c.at<float>(c.k_offset(row.block_table[j / c.block_size], kv_head, j % c.block_size)); };
  auto v_at = [&](std::int64_t j) { return c.at<float>(c.v_offset(row.block_table[j / c.block_size], kv_head, j % c.block_size)); };
  scores.resize(static_cast<std::size_t>(n));
  float m = -INFINITY;
  for (std::int64_t j = 0; j < n; ++j) {
    const float* k = k_at(j);
    float s = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) s += q[i] * k[i];
    s *= scale;
    scores[static_cast<std::size_t>(j)] = s;
    m = std::max(m, s);
  }
  float sum = 0.0f;
  for (auto& s : scores) sum += (s = std::exp(s - m));
  std::fill(out, out + d, 0.0f);
  for (std::int64_t j = 0; j < n; ++j) {
    const float* v = v_at(j);
    const float p = scores[static_cast<std::size_t>(j)] / sum;
    for (std::int64_t i = 0; i < d; ++i) out[i] += p * v[i];
  }
}

void paged_attention(ThreadPool& pool, const float* q, std::int64_t rows, std::int64_t num_heads,
                     const AttnRow* row_info, cpu::KvLayer cache, float scale, float* out) {
  const std::int64_t d = cache.head_dim, group = num_heads / cache.num_kv_heads;
  pool.parallel_for(rows * num_heads, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> scores;
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t r = i / num_heads, h = i % num_heads;
      attend(q + i * d, row_info[r], h / group, cache, scale, scores, out + i * d);
    }
  });
}

}  // namespace old_kernel

namespace {

constexpr std::int64_t kHeads = 12, kKvHeads = 4, kDim = 64, kBlock = 16;

struct Setup {
  // The caches on 2 MiB pages, as the CPU backend keeps its KV cache (KVFLEET_CPU_HUGEPAGES=0: small pages).
  std::unique_ptr<cpu::HugePageArena> arena = std::make_unique<cpu::HugePageArena>();
  std::size_t bytes = 0;  // of one layer's cache (--layers: one cache per layer)
  std::vector<cpu::KvLayer> caches;
  std::vector<std::vector<std::uint8_t>> kt_fresh;
  cpu::KvLayer cache;
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<AttnRow> rows;
  std::vector<float> q, out;
};

int g_layers = 1;  // --layers: caches per setup, each timed call runs them all (as a step runs its layers)

// `seqs` sequences of `context` keys; rows: the last position of each (decode) or every position of the
// first (prefill).

Setup make(DType dtype, int seqs, int context, bool prefill, bool with_kt = false) {
  Setup s;
  const std::int64_t blocks_per = (context + kBlock - 1) / kBlock;
  s.cache = {nullptr, dtype, kBlock, kKvHeads, kDim};
  const std::size_t bytes = static_cast<std::size_t>(seqs * blocks_per * s.cache.block_elems()) * dtype_size(dtype);
  std::mt19937 rng(1);
  std::vector<float> f(bytes / dtype_size(dtype));
  std::normal_distribution<float> normal;
  for (auto& x : f) x = normal(rng);
  for (int l = 0; l < g_layers; ++l) {  // every layer the same values: the work is what is measured
    std::byte* st = s.arena->take(bytes);
    if (dtype == DType::f32) std::memcpy(st, f.data(), bytes);
    else for (std::size_t i = 0; i < f.size(); ++i) {
      const std::uint16_t h = dtype == DType::bf16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
      std::memcpy(st + 2 * i, &h, 2);
    }
    s.caches.push_back(s.cache);
    s.caches.back().base = st;
    if (with_kt) {  // all stale: the first call transposes every block (refresh_transposed), as after a transfer
      s.caches.back().kt =
          s.arena->take(static_cast<std::size_t>(seqs * blocks_per * s.cache.kt_block_elems()) * dtype_size(dtype));
      s.kt_fresh.emplace_back(static_cast<std::size_t>(seqs * blocks_per), std::uint8_t{0});
      s.caches.back().kt_fresh = s.kt_fresh.back().data();
    }
  }
  s.bytes = bytes;
  s.cache.base = s.caches[0].base;
  for (int i = 0; i < seqs; ++i) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(blocks_per));
    for (std::int64_t b = 0; b < blocks_per; ++b) t[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(i * blocks_per + b);
    s.tables.push_back(std::move(t));
  }
  for (int i = 0; i < seqs; ++i) {
    if (prefill) {
      for (int p = 0; p < context; ++p) s.rows.push_back({p, s.tables[static_cast<std::size_t>(i)].data()});
    } else {
      s.rows.push_back({context - 1, s.tables[static_cast<std::size_t>(i)].data()});
    }
  }
  s.q.resize(s.rows.size() * kHeads * kDim);
  for (auto& x : s.q) x = normal(rng);
  s.out.resize(s.q.size());
  return s;
}

std::vector<std::int64_t> g_ahead;  // --ahead 0,1,2: attention's prefetch distances compared in turn (new kernel only)

bool g_cpu_time = false;  // --cpu-time: the process's CPU time instead of the wall clock (for --threads 1 on a
                          // loaded machine, where the wall clock mostly measures the waits for a core)

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <class Fn>
double seconds(Fn&& fn) {
  if (g_cpu_time) {
    const double t0 = process_cpu_seconds();
    fn();
    return process_cpu_seconds() - t0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void compare(ThreadPool& pool, const char* name, int seqs, int context, bool prefill, int reps, bool with_old = true) {
  Setup f32 = make(DType::f32, seqs, context, prefill), b16 = make(DType::bf16, seqs, context, prefill);
  const auto rows = static_cast<std::int64_t>(f32.rows.size());
  const float scale = 0.125f;
  double t_old = 1e30, t_new = 1e30, t_bf16 = 1e30;  // best of reps, each measured in turn
  std::vector<std::array<double, 4>> t_ahead(g_ahead.size(), {1e30, 1e30, 1e30, 1e30});
  Setup f32k, b16k;  // the same caches with K's transposed copy
  if (!g_ahead.empty()) {
    f32k = make(DType::f32, seqs, context, prefill, true);
    b16k = make(DType::bf16, seqs, context, prefill, true);
  }
  for (int r = 0; r < reps; ++r) {
    if (with_old)
      t_old = std::min(t_old, seconds([&] {
        for (const cpu::KvLayer& c : f32.caches)
          old_kernel::paged_attention(pool, f32.q.data(), rows, kHeads, f32.rows.data(), c, scale, f32.out.data());
      }));
    auto all_layers = [&](Setup& st) {
      for (const cpu::KvLayer& c : st.caches)
        cpu::paged_attention(pool, st.q.data(), rows, kHeads, st.rows.data(), c, scale, st.out.data());
    };
    if (r == 0 && !g_ahead.empty()) {  // untimed: the copies' first transposition
      all_layers(f32k);
      all_layers(b16k);
    }
    for (std::size_t a = 0; a < g_ahead.size(); ++a) {  // the prefetch variants in turn (--ahead)
      cpu::detail::set_attention_prefetch_blocks(g_ahead[a]);
      t_ahead[a][0] = std::min(t_ahead[a][0], seconds([&] { all_layers(f32); }));
      t_ahead[a][1] = std::min(t_ahead[a][1], seconds([&] { all_layers(b16); }));
      t_ahead[a][2] = std::min(t_ahead[a][2], seconds([&] { all_layers(f32k); }));
      t_ahead[a][3] = std::min(t_ahead[a][3], seconds([&] { all_layers(b16k); }));
    }
    if (!g_ahead.empty()) continue;
    t_new = std::min(t_new, seconds([&] { all_layers(f32); }));
    t_bf16 = std::min(t_bf16, seconds([&] { all_layers(b16); }));
  }
  if (!g_ahead.empty()) {
    std::printf("%-8s %3d seqs x %4d x %d layers:", name, seqs, context, g_layers);
    for (std::size_t a = 0; a < g_ahead.size(); ++a)
      std::printf("\n  ahead %lld: transposing K fp32 %8.3f ms, bf16 %8.3f ms | K's transposed copy fp32 %8.3f ms, "
                  "bf16 %8.3f ms", static_cast<long long>(g_ahead[a]), t_ahead[a][0] * 1e3, t_ahead[a][1] * 1e3,
                  t_ahead[a][2] * 1e3, t_ahead[a][3] * 1e3);
    const double kv_bytes = static_cast<double>(f32.bytes) * g_layers;
    if (!prefill)  // decode reads each K/V byte once: the best fp32 time as a read rate
      std::printf("\n  (fp32 KV %.1f MB: transposing, best %.1f GB/s)", kv_bytes / 1e6,
                  kv_bytes / std::min_element(t_ahead.begin(), t_ahead.end())->at(0) / 1e9);
    std::printf("\n");
    return;
  }
  if (!with_old) {
    std::printf("%-8s %3d seqs x %4d: old (not run) | new fp32 KV %8.3f ms | new bf16 KV %8.3f ms\n", name, seqs,
                context, t_new * 1e3, t_bf16 * 1e3);
    return;
  }
  std::printf("%-8s %3d seqs x %4d: old %8.3f ms | new fp32 KV %8.3f ms (%.2fx) | new bf16 KV %8.3f ms (%.2fx)\n",
              name, seqs, context, t_old * 1e3, t_new * 1e3, t_old / t_new, t_bf16 * 1e3, t_old / t_bf16);
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 2;
  int reps = 5;
  bool with_4k = false, new_only = false, prefill_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--4k") with_4k = true;
    else if (a == "--cpu-time") g_cpu_time = true;
    else if (a == "--new-only") new_only = true;
    else if (a == "--prefill-only") prefill_only = true;
    else if (a == "--threads" && i + 1 < argc) threads = static_cast<unsigned>(std::stoul(argv[++i]));
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--layers" && i + 1 < argc) g_layers = std::max(1, std::stoi(argv[++i]));
    else if (a == "--ahead" && i + 1 < argc) {
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) g_ahead.push_back(std::stoll(item));
    }
  }
  ThreadPool pool(threads);
  std::printf("kernel %s, threads %u, heads %lld/%lld, head_dim %lld, block %lld; best of %d interleaved runs\n",
              std::string(cpu::isa_name(cpu::cpu_isa())).c_str(), threads,
              static_cast<long long>(kHeads), static_cast<long long>(kKvHeads), static_cast<long long>(kDim),
              static_cast<long long>(kBlock), reps);
  if (!prefill_only) {
    compare(pool, "decode", 32, 64, false, reps, !new_only);
    compare(pool, "decode", 1, 512, false, reps, !new_only);
    compare(pool, "decode", 32, 512, false, reps, !new_only);
    compare(pool, "decode", 8, 4096, false, reps, !new_only);
  }
  compare(pool, "prefill", 1, 512, true, reps, !new_only);
  if (with_4k) compare(pool, "prefill", 1, 4096, true, reps, false);  // the old kernel: ~10 s a rep, left out
  return 0;
}
