// The AVX-512 GEMM/GEMV of main at 2632b1d (before packed weights and the 6 x 4 tile), copied in so that
// bench_matvec can time old and new kernels interleaved in one process (built with the same AVX-512 flags
// as kernels/cpu/linear_avx512.cpp). One thread, x arranged here; same arithmetic and bits as today's.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <bit>

#include "kvfleet/dtype.h"

namespace bench_old {
namespace {
using kvfleet::DType;
constexpr std::int64_t kBlock = 32, kLanes = 16;

struct GemmArgs {
  const float* xa = nullptr;
  std::int64_t rows = 0, in = 0, kp = 0;
  const std::uint8_t* w = nullptr;
  std::size_t row_bytes = 0;
  DType dtype = DType::f32;
  float* y = nullptr;
  std::int64_t ldy = 0;
};

float widen(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

void tail_weights(const std::uint8_t* row, DType, std::int64_t block_start, std::int64_t in, float* lo, float* hi) {
  const auto* h = reinterpret_cast<const std::uint16_t*>(row);  // bf16 only
  for (std::int64_t j = 0; j < kLanes; ++j) {
    const std::int64_t a = block_start + 2 * j, b = a + 1;
    lo[j] = a < in ? widen(h[a]) : 0.0f;
    hi[j] = b < in ? widen(h[b]) : 0.0f;
  }
}
struct Block {
  __m512 lo, hi;
};

inline Block load_block(const std::uint8_t* row, DType dt, std::int64_t b) {
  if (dt == DType::bf16) {
    const __m512i v = _mm512_loadu_si512(reinterpret_cast<const std::uint16_t*>(row) + b);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  if (dt == DType::f16) {
    const auto* p = reinterpret_cast<const __m256i*>(reinterpret_cast<const std::uint16_t*>(row) + b);
    return {_mm512_cvtph_ps(_mm256_loadu_si256(p)), _mm512_cvtph_ps(_mm256_loadu_si256(p + 1))};
  }
  const float* p = reinterpret_cast<const float*>(row) + b;
  return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)};
}

inline float reduce(__m512 v) {
  const __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
  const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
  return _mm_cvtss_f32(_mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1)));
}

// M rows x N features, the reduction loop innermost: M * N accumulators, each weight block widened once
// for the M rows, each x block loaded once for the N features.
template <int M, int N>
void tile(const GemmArgs& g, std::int64_t t0, std::int64_t n0) {
  __m512 acc[M][N];
  for (auto& r : acc)
    for (auto& c : r) c = _mm512_setzero_ps();
  const std::uint8_t* rows[N];
  for (int n = 0; n < N; ++n) rows[n] = g.w + static_cast<std::size_t>(n0 + n) * g.row_bytes;
  const float* x0 = g.xa + t0 * g.kp;
  auto step = [&](std::int64_t b, const Block* w) {
    for (int m = 0; m < M; ++m) {
      const __m512 xl = _mm512_loadu_ps(x0 + m * g.kp + b), xh = _mm512_loadu_ps(x0 + m * g.kp + b + 16);
      for (int n = 0; n < N; ++n) acc[m][n] = _mm512_fmadd_ps(xh, w[n].hi, _mm512_fmadd_ps(xl, w[n].lo, acc[m][n]));
    }
  };
  const std::int64_t full = g.in / kBlock * kBlock;
  for (std::int64_t b = 0; b < full; b += kBlock) {
    Block w[N];
    for (int n = 0; n < N; ++n) w[n] = load_block(rows[n], g.dtype, b);
    step(b, w);
  }
  if (full < g.kp) {
    alignas(64) float tail[N][2][kLanes];
    Block w[N];
    for (int n = 0; n < N; ++n) {
      tail_weights(rows[n], g.dtype, full, g.in, tail[n][0], tail[n][1]);
      w[n] = {_mm512_load_ps(tail[n][0]), _mm512_load_ps(tail[n][1])};
    }
    step(full, w);
  }
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) g.y[(t0 + m) * g.ldy + n0 + n] = reduce(acc[m][n]);
}

constexpr int kM = 4, kN = 4;      // the GEMM tile: 16 accumulators + 8 weight registers
constexpr int kGemvN = 8;          // one row: 8 weight rows streamed side by side
constexpr std::int64_t kRowBlock = 16;  // rows whose x (16 x 3 KiB at hidden 768) stays in L1/L2 per feature sweep

template <int N>
void rows_of(const GemmArgs& g, std::int64_t t0, std::int64_t t1, std::int64_t n0) {
  std::int64_t t = t0;
  for (; t + kM <= t1; t += kM) tile<kM, N>(g, t, n0);
  switch (t1 - t) {
    case 3: tile<3, N>(g, t, n0); break;
    case 2: tile<2, N>(g, t, n0); break;
    case 1: tile<1, N>(g, t, n0); break;
    default: break;
  }
}

}  // namespace

void gemm_avx512(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  if (g.rows == 1) {
    std::int64_t n = n0;
    for (; n + kGemvN <= n1; n += kGemvN) tile<1, kGemvN>(g, 0, n);
    for (; n < n1; ++n) tile<1, 1>(g, 0, n);
    return;
  }
  for (std::int64_t t0 = 0; t0 < g.rows; t0 += kRowBlock) {
    const std::int64_t t1 = t0 + kRowBlock < g.rows ? t0 + kRowBlock : g.rows;
    std::int64_t n = n0;
    for (; n + kN <= n1; n += kN) rows_of<kN>(g, t0, t1, n);
    for (; n < n1; ++n) rows_of<1>(g, t0, t1, n);
  }
}

// y = x w^T for bf16 w [out][in], one thread.
void linear_bf16(const float* x, std::int64_t rows, std::int64_t in, const std::uint16_t* w, std::int64_t out, float* y) {
  const std::int64_t kp = (in + kBlock - 1) / kBlock * kBlock;
  thread_local std::vector<float> xa;
  xa.resize(static_cast<std::size_t>(rows * kp));
  for (std::int64_t t = 0; t < rows; ++t)
    for (std::int64_t b = 0; b < kp; b += kBlock)
      for (std::int64_t j = 0; j < kLanes; ++j) {
        const std::int64_t e = b + 2 * j, o = e + 1;
        xa[static_cast<std::size_t>(t * kp + b + j)] = e < in ? x[t * in + e] : 0.0f;
        xa[static_cast<std::size_t>(t * kp + b + kLanes + j)] = o < in ? x[t * in + o] : 0.0f;
      }
  const GemmArgs g{xa.data(), rows, in, kp, reinterpret_cast<const std::uint8_t*>(w), static_cast<std::size_t>(in) * 2,
                   DType::bf16, y, out};
  gemm_avx512(g, 0, out);
}

}  // namespace bench_old
