// Decode-shaped matrix-vector products (batch 1) on the CPU, against the machine's copy bandwidth measured
// in the same run. A decode step reads every weight once, so its speed limit is memory bandwidth.
//
//   build/bin/bench_matvec [--threads N] [--mb 1024] [--rounds 3] [--kernels-only 1] [--gemv-only 1]
//                          [--chain TOKENS [--hidden 768 --intermediate 2048 --layers 12 --kv-dim 256 --vocab 32000]
//                           [--variants e8:32,t8:32,t2:0:0]]
// --chain: a batch-1 decode token's linear calls (packed bf16, the model shape given), variants token by
// token in one process: e/t = equal or tapered chunks (ThreadPool::parallel_for_tapered), L1:L2 = the
// packed prefetch distances in blocks (the GEMV as a tile); t2:0:0 = 2 streams, L1:L2 (the panel GEMV);
// "+h" after a variant: the weights as the CPU backend holds them (HugePageArena: 2 MiB pages), without it
// in plain vectors (4 KiB pages); "read" and "ops": no arithmetic, as many bytes read from one buffer in
// the pool's equal chunks, or the weights read as the token's ops read them (one pool op per weight): what
// the memory gives, and what is left of it after the op structure.
// --gemv-only 1: bf16 weights of --mb MiB (from memory) on the pool, plain rows vs packed panels
// alternating: batch 1 (GEMV) and 2-32 rows (the GEMM, which at few rows still streams the weights).
// First (AVX-512 CPUs) the kernels alone on one thread, by CPU time: today's on plain and on packed
// weights, and the avx512bf16 mode, interleaved.
//   (KVFLEET_CPU_ISA=avx512|avx2|scalar|avx512bf16 picks the kernel; plain and packed weights alternate)
//
// Prints, for f32/bf16/f16 weights, the achieved weight-read bandwidth and its ratio to the copy bandwidth
// (bytes read + written per second by a parallel memcpy over the same thread pool) and to a read-only
// stream (the tighter ceiling, since a matvec only reads).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/backend/cpu/huge_page_arena.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"

using namespace kvfleet;
using Clock = std::chrono::steady_clock;

namespace {

template <class Fn>
double best_seconds(int reps, Fn fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

double copy_bandwidth(ThreadPool& pool, std::size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double s = best_seconds(5, [&] {
    pool.parallel_for(static_cast<std::int64_t>(bytes), 1 << 20, [&](std::int64_t b, std::int64_t e) {
      std::memcpy(dst.data() + b, src.data() + b, static_cast<std::size_t>(e - b));
    });
  });
  return 2.0 * static_cast<double>(bytes) / s;  // read + write
}

// A pure read stream (sum of 32-byte vectors): the ceiling for a kernel that only reads.
double read_bandwidth(ThreadPool& pool, std::size_t bytes) {
  std::vector<float> src(bytes / sizeof(float), 1.0f);
  std::vector<float> partial(pool.size() * 16, 0.0f);
  const double s = best_seconds(5, [&] {
    pool.parallel_for(static_cast<std::int64_t>(src.size() / 64), 1024, [&](std::int64_t b, std::int64_t e) {
      __m256 acc = _mm256_setzero_ps();
      for (std::int64_t i = b * 64; i < e * 64; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(&src[static_cast<std::size_t>(i)]));
      float out[8];
      _mm256_storeu_ps(out, acc);
      partial[static_cast<std::size_t>(b % static_cast<std::int64_t>(partial.size()))] += out[0];
    });
  });
  std::printf("%s", partial[0] < 0 ? " " : "");  // keep the sums alive
  return static_cast<double>(bytes) / s;
}

// The weight as cpu::linear reads it: plain, or re-arranged by pack_weight (what the CPU backend runs).
// The packed copy starts on a cache line, as the CPU backend's does (packed_ has 64 bytes of slack).
struct Weight {
  std::vector<std::uint8_t> plain, packed_;
  DType dt;
  std::int64_t out, in;
  const std::uint8_t* packed() const {
    const auto p = reinterpret_cast<std::uintptr_t>(packed_.data());
    return packed_.data() + ((64 - p % 64) % 64);
  }
  cpu::WeightRef ref(bool pack) const { return {pack ? nullptr : plain.data(), dt, pack ? packed() : nullptr}; }
};

void pack(Weight& w) {
  w.packed_.resize(cpu::packed_weight_bytes(w.out, w.in, w.dt) + 64);
  cpu::pack_weight(w.plain.data(), w.dt, w.out, w.in, const_cast<std::uint8_t*>(w.packed()));
}

double matvec_bandwidth(ThreadPool& pool, const Weight& w, bool packed, int reps) {
  std::vector<float> x(static_cast<std::size_t>(w.in), 0.5f), y(static_cast<std::size_t>(w.out));
  const double s = best_seconds(reps, [&] { cpu::linear(pool, x.data(), 1, w.in, w.ref(packed), w.out, {}, y.data()); });
  return static_cast<double>(w.plain.size()) / s;
}

Weight make_weight(DType dt, std::size_t weight_bytes) {
  const std::int64_t in = 2048;
  const std::int64_t out = static_cast<std::int64_t>(weight_bytes / dtype_size(dt)) / in;
  Weight weight{std::vector<std::uint8_t>(static_cast<std::size_t>(out * in) * dtype_size(dt)), {}, dt, out, in};
  std::vector<std::uint8_t>& w = weight.plain;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::uint8_t>((i * 131) >> 3);
  // The top byte of each value fixes its sign and exponent: normal numbers near 2^-7 (bf16, f32) or 1
  // (f16). (Clearing exponent bits instead made many weights subnormal: an FMA with a subnormal input
  // takes a microcode assist, which measured the assists, not the memory.)
  const std::size_t top = dt == DType::f32 ? 4 : 2;
  for (std::size_t i = top - 1; i < w.size(); i += top) w[i] = static_cast<std::uint8_t>(0x3c | (w[i] & 0x80));
  pack(weight);
  return weight;
}

// Prefill-shaped: rows x 768 activations against a bf16 [2048][768] weight (the 125M Llama's gate).
Weight gate_weight() {
  const std::int64_t in = 768, out = 2048;
  Weight w{std::vector<std::uint8_t>(static_cast<std::size_t>(out * in) * 2), {}, DType::bf16, out, in};
  auto* h = reinterpret_cast<std::uint16_t*>(w.plain.data());
  for (std::size_t i = 0; i < w.plain.size() / 2; ++i) h[i] = static_cast<std::uint16_t>(0x3c00 | (i * 131 % 251));
  pack(w);
  return w;
}

double gemm_gflops(ThreadPool& pool, const Weight& w, std::int64_t rows, bool packed, int reps) {
  std::vector<float> x(static_cast<std::size_t>(rows * w.in), 0.5f), y(static_cast<std::size_t>(rows * w.out));
  const double s = best_seconds(reps, [&] { cpu::linear(pool, x.data(), rows, w.in, w.ref(packed), w.out, {}, y.data()); });
  return 2.0 * static_cast<double>(rows * w.in * w.out) / s / 1e9;
}

// One thread's CPU time (not wall time: on a shared machine a long call is always preempted somewhere).
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Today's kernel on plain and packed weights, and the avx512bf16 mode, one thread, interleaved: GFLOP/s
// per second of CPU time, best of `rounds`.
void kernel_ab(const Weight& w, int rounds) {
  ThreadPool one(1);
  const bool bf16_mode = cpu::cpu_supports(cpu::Isa::avx512bf16);
  const cpu::Isa saved = cpu::cpu_isa();
  std::printf("one thread, CPU time, bf16 %lld -> %lld: plain | packed | packed avx512bf16 mode\n",
              static_cast<long long>(w.in), static_cast<long long>(w.out));
  for (std::int64_t rows : {1, 4, 8, 32, 128, 512}) {
    std::vector<float> x(static_cast<std::size_t>(rows * w.in), 0.5f), y(static_cast<std::size_t>(rows * w.out));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f + static_cast<float>(i % 97) / 128.0f;
    double best[3] = {1e30, 1e30, 1e30};
    const int reps = rows >= 128 ? 1 : 8;
    for (int r = 0; r < rounds; ++r)
      for (int k = 0; k < 3; ++k) {
        if (k == 2 && !bf16_mode) continue;
        cpu::set_cpu_isa(k == 2 ? cpu::Isa::avx512bf16 : saved);
        const double t0 = thread_seconds();
        for (int i = 0; i < reps; ++i) cpu::linear(one, x.data(), rows, w.in, w.ref(k >= 1), w.out, {}, y.data());
        best[k] = std::min(best[k], (thread_seconds() - t0) / reps);
      }
    cpu::set_cpu_isa(saved);
    const double flop = 2.0 * static_cast<double>(rows * w.in * w.out);
    std::printf("  rows %3lld: %7.1f | %7.1f | %7.1f GFLOP/s   packed/plain %.2fx, bf16 mode/plain %.2fx\n",
                static_cast<long long>(rows), flop / best[0] / 1e9, flop / best[1] / 1e9,
                bf16_mode ? flop / best[2] / 1e9 : 0.0, best[0] / best[1], bf16_mode ? best[0] / best[2] : 0.0);
  }
}

// Batch 1 from memory (a weight far beyond L3), one thread, CPU time: plain rows and packed panels.
void gemv_ab(std::size_t mb, int rounds) {
  ThreadPool one(1);
  const Weight w = make_weight(DType::bf16, mb << 20);
  std::vector<float> x(static_cast<std::size_t>(w.in), 0.5f), y(static_cast<std::size_t>(w.out));
  double best[2] = {1e30, 1e30};
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 2; ++k) {
      const double t0 = thread_seconds();
      cpu::linear(one, x.data(), 1, w.in, w.ref(k == 1), w.out, {}, y.data());
      best[k] = std::min(best[k], thread_seconds() - t0);
    }
  const double bytes = static_cast<double>(w.plain.size());
  std::printf("one thread, CPU time, bf16 GEMV over %zu MiB: plain %.2f GB/s | packed %.2f GB/s   packed/plain %.2fx\n",
              mb, bytes / best[0] / 1e9, bytes / best[1] / 1e9, best[0] / best[1]);
}

// A decode token's chain of linear calls on the pool, as the CPU backend issues them at batch 1 (per layer
// the fused Q/K/V, O, the fused gate/up and down; then the lm_head), on packed bf16 weights of the given
// model shape (default: the 125M Llama, ~200 MB a token). Equal chunks and tapered ones
// (set_tapered_split) and prefetch distances (set_packed_prefetch) alternate token by token, as variants
// "e8:32" (equal chunks, 8 blocks ahead into L1, 32 into L2) or "t8:32" (tapered); prints each one's best
// and median token time and GB/s.
// "t2:0:0" (a digit and two distances) runs the panel GEMV (set_packed_gemv) with that many streams and
// prefetch distances, "t8:32" (two numbers) the GEMV as a tile with those distances (set_packed_prefetch);
// "@N" after either: tapered chunks down to N KiB of weights (set_taper_tail_bytes; without it the default).
// --rows R (default 1): R rows a call, a batched decode step's; above 1 every call is the tiled GEMM, so only
// the tile's distances ("t8:32" against "t0:0") differ between variants.
struct ChainVariant {
  bool tapered;
  std::uint32_t streams, l1, l2;  // streams 0: the tile
  std::string name;
  std::int64_t tail_kib = 0;  // 0: the default tail
  bool huge = false;          // "+h" after the variant: the weights' copy on 2 MiB pages
};

// Pseudo-variants: "read" reads as many bytes as a token's weights, one buffer cut in the pool's equal chunks
// (what the memory gives); "ops" reads the weights themselves (the vectors, or with "+h" the arena's copy),
// one pool op per weight matrix in tapered chunks down to 96 KiB as the GEMV's ops split them, with no
// arithmetic.
constexpr std::uint32_t kReadAll = 1000, kReadOps = 1001;
thread_local float g_read_sink = 0;  // keeps the sums alive

float sum_lines(const std::uint8_t* p, std::size_t bytes) {  // a pure read of whole 64-byte lines (AVX2)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  for (std::size_t i = 0; i + 64 <= bytes; i += 64) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(reinterpret_cast<const float*>(p + i)));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(reinterpret_cast<const float*>(p + i + 32)));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(a0, a1));
  return out[0];
}

std::vector<ChainVariant> chain_variants(const std::string& s) {  // "e8:32,t8:32,t2:0:0"
  std::vector<ChainVariant> v;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t j = std::min(s.find(',', i), s.size());
    std::string item = s.substr(i, j - i);
    std::int64_t tail_kib = 0;
    bool huge = false;
    if (item.size() > 2 && item.compare(item.size() - 2, 2, "+h") == 0) {
      huge = true;
      item.resize(item.size() - 2);
    }
    if (const std::size_t at = item.find('@'); at != std::string::npos) {
      tail_kib = std::stoll(item.substr(at + 1));
      item.resize(at);
    }
    const std::string name = s.substr(i, j - i);
    i = j + 1;
    if (item == "read" || item == "ops") {
      v.push_back({true, item == "read" ? kReadAll : kReadOps, 0, 0, name, 0, huge});
      continue;
    }
    std::vector<std::uint32_t> nums;
    for (std::size_t k = 1; k < item.size();) {
      const std::size_t c = std::min(item.find(':', k), item.size());
      nums.push_back(static_cast<std::uint32_t>(std::stoul(item.substr(k, c - k))));
      k = c + 1;
    }
    if (nums.size() == 3) v.push_back({item[0] == 't', nums[0], nums[1], nums[2], name, tail_kib, huge});
    else v.push_back({item[0] == 't', 0, nums.at(0), nums.at(1), name, tail_kib, huge});
  }
  return v;
}

void decode_chain(unsigned threads, int tokens, std::int64_t rows, std::int64_t hidden, std::int64_t inter,
                  std::int64_t layers, std::int64_t kv_dim, std::int64_t vocab, const std::vector<ChainVariant>& variants) {
  ThreadPool pool(threads);
  struct Packed {
    std::vector<std::uint8_t> bytes;
    std::int64_t out, in;
    cpu::WeightRef ref() const {
      const auto p = reinterpret_cast<std::uintptr_t>(bytes.data());
      return {nullptr, DType::bf16, bytes.data() + ((64 - p % 64) % 64)};
    }
  };
  auto make = [](std::int64_t out, std::int64_t in) {
    std::vector<std::uint16_t> plain(static_cast<std::size_t>(out * in));
    for (std::size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<std::uint16_t>(0x3c00 | (i * 131 % 251));
    Packed w{std::vector<std::uint8_t>(cpu::packed_weight_bytes(out, in, DType::bf16) + 64), out, in};
    cpu::pack_weight(plain.data(), DType::bf16, out, in, const_cast<void*>(w.ref().packed));
    return w;
  };
  std::vector<Packed> ws;  // per layer: q, k, v, o, gate, up, down; then the lm_head
  const std::pair<std::int64_t, std::int64_t> layer_shapes[] = {{hidden, hidden}, {kv_dim, hidden}, {kv_dim, hidden},
                                                                 {hidden, hidden}, {inter, hidden}, {inter, hidden},
                                                                 {hidden, inter}};
  for (std::int64_t l = 0; l < layers; ++l)
    for (const auto& shape : layer_shapes) ws.push_back(make(shape.first, shape.second));
  ws.push_back(make(vocab, hidden));
  double bytes = 0;
  for (const Packed& w : ws) bytes += 2.0 * static_cast<double>(w.out * w.in);
  std::vector<float> x(static_cast<std::size_t>(rows * std::max(hidden, inter)), 0.5f),
      y(static_cast<std::size_t>(rows * (vocab + 4 * inter)));
  // The same packed bytes again in a HugePageArena, as the CPU backend holds them (2 MiB pages where the
  // kernel gives them): variants ending in "+h" read this copy, the others the vectors (4 KiB pages).
  cpu::HugePageArena arena;
  std::vector<const void*> huge;
  const bool any_huge = std::any_of(variants.begin(), variants.end(), [](const ChainVariant& v) { return v.huge; });
  if (any_huge)
    for (const Packed& w : ws) {
      const std::size_t n = cpu::packed_weight_bytes(w.out, w.in, DType::bf16);
      std::byte* p = arena.take(n);
      std::memcpy(p, w.ref().packed, n);
      huge.push_back(p);
    }
  bool use_huge = false;
  auto ref = [&](std::size_t i) {
    cpu::WeightRef r = ws[i].ref();
    if (use_huge) r.packed = huge[i];
    return r;
  };
  auto token = [&] {
    float* a = y.data();
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::size_t i0 = static_cast<std::size_t>(l * 7);
      const cpu::LinearPart qkv[3] = {{ref(i0), hidden, {}, a}, {ref(i0 + 1), kv_dim, {}, a + rows * hidden},
                                      {ref(i0 + 2), kv_dim, {}, a + rows * (hidden + kv_dim)}};
      cpu::linear_multi(pool, x.data(), rows, hidden, qkv, 3);
      cpu::linear(pool, x.data(), rows, hidden, ref(i0 + 3), hidden, {}, a);
      const cpu::LinearPart gu[2] = {{ref(i0 + 4), inter, {}, a}, {ref(i0 + 5), inter, {}, a + rows * inter}};
      cpu::linear_multi(pool, x.data(), rows, hidden, gu, 2);
      cpu::linear(pool, x.data(), rows, inter, ref(i0 + 6), hidden, {}, a);
    }
    cpu::linear(pool, x.data(), rows, hidden, ref(ws.size() - 1), vocab, {}, a);
  };
  const bool any_read = std::any_of(variants.begin(), variants.end(), [](const ChainVariant& v) { return v.streams == kReadAll; });
  std::vector<std::uint8_t> all(any_read ? static_cast<std::size_t>(bytes) + 64 : 0, 1);
  auto read_all = [&] {
    const std::int64_t lines = static_cast<std::int64_t>(bytes) / 64;
    pool.parallel_for(lines, 4096, [&](std::int64_t b, std::int64_t e) {
      g_read_sink += sum_lines(all.data() + b * 64, static_cast<std::size_t>(e - b) * 64);
    });
  };
  auto read_ops = [&] {
    for (std::size_t i = 0; i < ws.size(); ++i) {
      const auto* p = static_cast<const std::uint8_t*>(ref(i).packed);
      const std::int64_t lines = 2 * ws[i].out * ws[i].in / 64;
      pool.parallel_for_tapered(lines, 1, 1536, [&](std::int64_t b, std::int64_t e) {
        g_read_sink += sum_lines(p + b * 64, static_cast<std::size_t>(e - b) * 64);
      });
    }
  };
  std::uint32_t gemv_streams = 0, gemv_l1 = 0, gemv_l2 = 0;  // restored at the end
  cpu::detail::packed_gemv(gemv_streams, gemv_l1, gemv_l2);
  const std::int64_t default_tail = cpu::detail::taper_tail_bytes();
  std::vector<std::vector<double>> t(variants.size());
  for (int i = 0; i < tokens; ++i)
    for (std::size_t k = 0; k < variants.size(); ++k) {  // round robin, each round starting one further on
      const std::size_t v = (k + static_cast<std::size_t>(i)) % variants.size();
      cpu::detail::set_tapered_split(variants[v].tapered);
      cpu::detail::set_taper_tail_bytes(variants[v].tail_kib > 0 ? variants[v].tail_kib << 10 : default_tail);
      use_huge = variants[v].huge;
      if (variants[v].streams == kReadAll || variants[v].streams == kReadOps) {
        t[v].push_back(variants[v].streams == kReadAll ? best_seconds(1, read_all) : best_seconds(1, read_ops));
        continue;
      }
      if (variants[v].streams == 0) {
        cpu::detail::set_packed_gemv(0, 0, 0);
        cpu::detail::set_packed_prefetch(variants[v].l1, variants[v].l2);
      } else {
        cpu::detail::set_packed_gemv(variants[v].streams, variants[v].l1, variants[v].l2);
        cpu::detail::set_packed_prefetch(8, 32);
      }
      t[v].push_back(best_seconds(1, token));
    }
  cpu::detail::set_tapered_split(true);
  cpu::detail::set_taper_tail_bytes(default_tail);
  cpu::detail::set_packed_prefetch(8, 32);
  cpu::detail::set_packed_gemv(gemv_streams, gemv_l1, gemv_l2);
  std::printf("decode chain, %u threads, %lld rows, %lld layers, hidden %lld, %.0f MB a step, %d steps each:\n",
              pool.size(), static_cast<long long>(rows), static_cast<long long>(layers), static_cast<long long>(hidden),
              bytes / 1e6, tokens);
  for (std::size_t v = 0; v < variants.size(); ++v) {
    std::sort(t[v].begin(), t[v].end());
    const double best = t[v].front(), med = t[v][t[v].size() / 2];
    const ChainVariant& cv = variants[v];
    if (cv.streams == kReadAll || cv.streams == kReadOps) {
      std::printf("  %-12s %s: best %7.3f ms (%.2f GB/s), median %7.3f ms (%.2f GB/s); median vs the first: %.3fx\n",
                  cv.name.c_str(), cv.streams == kReadAll ? "one buffer, equal chunks, no arithmetic  "
                                                          : "the weights, an op each, no arithmetic   ",
                  best * 1e3, bytes / best / 1e9, med * 1e3, bytes / med / 1e9, t[0][t[0].size() / 2] / med);
      continue;
    }
    std::printf("  %-12s %s chunks, %s, prefetch %2u / %2u blocks: best %7.3f ms (%.2f GB/s), median %7.3f ms "
                "(%.2f GB/s); median vs the first: %.3fx\n",
                cv.name.c_str(), cv.tapered ? "taper" : "equal",
                cv.streams == 0 ? "tile     " : cv.streams == 1 ? "1 stream " : "2 streams", cv.l1, cv.l2, best * 1e3,
                bytes / best / 1e9, med * 1e3, bytes / med / 1e9, t[0][t[0].size() / 2] / med);
  }
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 0;
  std::size_t mb = 1024;  // far beyond this VM's 260 MiB of L3
  int rounds = 3;
  bool kernels_only = false, gemv_only = false;
  int chain = 0;  // --chain N: decode_chain with N tokens of each split
  std::int64_t rows = 1, hidden = 768, inter = 2048, layers = 12, kv_dim = 256, vocab = 32000;
  std::string variants = "e8:32,t8:32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else if (a == "--mb") mb = std::stoul(argv[i + 1]);
    else if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    else if (a == "--kernels-only") kernels_only = argv[i + 1] == std::string("1");
    else if (a == "--gemv-only") gemv_only = argv[i + 1] == std::string("1");
    else if (a == "--chain") chain = std::stoi(argv[i + 1]);
    else if (a == "--rows") rows = std::stoll(argv[i + 1]);
    else if (a == "--hidden") hidden = std::stoll(argv[i + 1]);
    else if (a == "--intermediate") inter = std::stoll(argv[i + 1]);
    else if (a == "--layers") layers = std::stoll(argv[i + 1]);
    else if (a == "--kv-dim") kv_dim = std::stoll(argv[i + 1]);
    else if (a == "--vocab") vocab = std::stoll(argv[i + 1]);
    else if (a == "--variants") variants = argv[i + 1];
  }
  if (chain > 0) {
    decode_chain(threads, chain, rows, hidden, inter, layers, kv_dim, vocab, chain_variants(variants));
    return 0;
  }
  if (gemv_only) {  // bf16 weights from memory, plain rows vs packed panels, alternating, on the pool
    ThreadPool pool(threads);
    const Weight w = make_weight(DType::bf16, mb << 20);
    double bw[2] = {0, 0};
    for (int round = 0; round < rounds; ++round)
      for (int p = 0; p < 2; ++p) bw[p] = std::max(bw[p], matvec_bandwidth(pool, w, p == 1, 3));
    std::printf("gemv bf16 %zu MiB, %u threads: plain %.2f GB/s | packed %.2f GB/s   packed/plain %.3f\n", mb,
                pool.size(), bw[0] / 1e9, bw[1] / 1e9, bw[1] / bw[0]);
    for (std::int64_t rows : {2, 4, 8, 16, 32}) {  // small batches: the GEMM still streams the weights
      std::vector<float> x(static_cast<std::size_t>(rows * w.in), 0.5f), y(static_cast<std::size_t>(rows * w.out));
      double best[2] = {1e30, 1e30};
      for (int round = 0; round < rounds; ++round)
        for (int p = 0; p < 2; ++p)
          best[p] = std::min(best[p], best_seconds(1, [&] {
                               cpu::linear(pool, x.data(), rows, w.in, w.ref(p == 1), w.out, {}, y.data());
                             }));
      const double bytes = static_cast<double>(w.plain.size());
      std::printf("gemm bf16 %zu MiB, %u threads, rows %2lld: plain %.2f GB/s | packed %.2f GB/s   packed/plain %.3f\n",
                  mb, pool.size(), static_cast<long long>(rows), bytes / best[0] / 1e9, bytes / best[1] / 1e9,
                  best[0] / best[1]);
    }
    return 0;
  }
  if (kernels_only || cpu::cpu_supports(cpu::Isa::avx512)) {
    const Weight gate = gate_weight();
    kernel_ab(gate, rounds);
    Weight down{std::vector<std::uint8_t>(gate.plain), {}, DType::bf16, 768, 2048};  // the MLP's down projection
    pack(down);
    kernel_ab(down, rounds);
    gemv_ab(std::min<std::size_t>(mb, 512), rounds);
    if (kernels_only) return 0;
  }
  ThreadPool pool(threads);
  const std::size_t bytes = mb << 20;
  const double copy = copy_bandwidth(pool, bytes);
  std::printf("threads %u, %zu MB of weights (well beyond the caches)\n", pool.size(), mb);
  const double read = read_bandwidth(pool, bytes);
  std::printf("%-28s %8.2f GB/s\n", "memcpy (read+write)", copy / 1e9);
  std::printf("%-28s %8.2f GB/s\n", "read-only stream", read / 1e9);
  // Plain and packed alternate within each repetition round (the machine may be shared).
  const Weight gate = gate_weight();
  for (std::int64_t rows : {8, 32, 512}) {
    double best[2] = {0, 0};
    for (int round = 0; round < rounds; ++round)
      for (int p = 0; p < 2; ++p) best[p] = std::max(best[p], gemm_gflops(pool, gate, rows, p == 1, 3));
    std::printf("gemm bf16 %3lld x 768 x 2048: %8.1f GFLOP/s plain  %8.1f packed\n", static_cast<long long>(rows),
                best[0], best[1]);
  }
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Weight w = make_weight(dt, bytes);
    double bw[2] = {0, 0};
    for (int round = 0; round < rounds; ++round)
      for (int p = 0; p < 2; ++p) bw[p] = std::max(bw[p], matvec_bandwidth(pool, w, p == 1, 3));
    for (int p = 0; p < 2; ++p)
      std::printf("matvec %-5s weights %-6s batch 1 %8.2f GB/s  = %5.1f%% of copy, %5.1f%% of read-only\n",
                  std::string(dtype_name(dt)).c_str(), p ? "packed" : "plain", bw[p] / 1e9, 100.0 * bw[p] / copy,
                  100.0 * bw[p] / read);
  }
  return 0;
}
