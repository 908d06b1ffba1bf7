// Decode-shaped matrix-vector products (batch 1) on the CPU, against the machine's copy bandwidth measured
// in the same run. A decode step reads every weight once, so its speed limit is memory bandwidth.
//
//   build/bin/bench_matvec [--threads N] [--mb 1024]   (KVFLEET_CPU_ISA=avx512|avx2|scalar picks the kernel)
//
// Prints, for f32/bf16/f16 weights, the achieved weight-read bandwidth and its ratio to the copy bandwidth
// (bytes read + written per second by a parallel memcpy over the same thread pool) and to a read-only
// stream (the tighter ceiling, since a matvec only reads).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

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

double matvec_bandwidth(ThreadPool& pool, DType dt, std::size_t weight_bytes) {
  const std::int64_t in = 2048;
  const std::int64_t out = static_cast<std::int64_t>(weight_bytes / dtype_size(dt)) / in;
  std::vector<std::uint8_t> w(static_cast<std::size_t>(out * in) * dtype_size(dt));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::uint8_t>((i * 131) >> 3);
  // The top byte of each value fixes its sign and exponent: normal numbers near 2^-7 (bf16, f32) or 1
  // (f16). (Clearing exponent bits instead made many weights subnormal: an FMA with a subnormal input
  // takes a microcode assist, which measured the assists, not the memory.)
  const std::size_t top = dt == DType::f32 ? 4 : 2;
  for (std::size_t i = top - 1; i < w.size(); i += top) w[i] = static_cast<std::uint8_t>(0x3c | (w[i] & 0x80));
  std::vector<float> x(static_cast<std::size_t>(in), 0.5f), y(static_cast<std::size_t>(out));
  const double s = best_seconds(7, [&] {
    cpu::linear(pool, x.data(), 1, in, {w.data(), dt}, out, {}, y.data());
  });
  return static_cast<double>(w.size()) / s;
}

// Prefill-shaped: rows x 768 activations against a bf16 [2048][768] weight (the 125M Llama's gate).
double gemm_gflops(ThreadPool& pool, std::int64_t rows) {
  const std::int64_t in = 768, out = 2048;
  std::vector<std::uint16_t> w(static_cast<std::size_t>(out * in));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::uint16_t>(0x3c00 | (i * 131 % 251));
  std::vector<float> x(static_cast<std::size_t>(rows * in), 0.5f), y(static_cast<std::size_t>(rows * out));
  const double s = best_seconds(3, [&] {
    cpu::linear(pool, x.data(), rows, in, {w.data(), DType::bf16}, out, {}, y.data());
  });
  return 2.0 * static_cast<double>(rows * in * out) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 0;
  std::size_t mb = 1024;  // far beyond this VM's 260 MiB of L3
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else if (a == "--mb") mb = std::stoul(argv[i + 1]);
  }
  ThreadPool pool(threads);
  const std::size_t bytes = mb << 20;
  const double copy = copy_bandwidth(pool, bytes);
  std::printf("threads %u, %zu MB of weights (well beyond the caches)\n", pool.size(), mb);
  const double read = read_bandwidth(pool, bytes);
  std::printf("%-28s %8.2f GB/s\n", "memcpy (read+write)", copy / 1e9);
  std::printf("%-28s %8.2f GB/s\n", "read-only stream", read / 1e9);
  for (std::int64_t rows : {8, 32, 512})
    std::printf("gemm bf16 %3lld x 768 x 2048: %8.1f GFLOP/s\n", static_cast<long long>(rows), gemm_gflops(pool, rows));
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const double bw = matvec_bandwidth(pool, dt, bytes);
    std::printf("matvec %-5s weights, batch 1 %8.2f GB/s  = %5.1f%% of copy, %5.1f%% of read-only\n",
                std::string(dtype_name(dt)).c_str(), bw / 1e9, 100.0 * bw / copy, 100.0 * bw / read);
  }
  return 0;
}
