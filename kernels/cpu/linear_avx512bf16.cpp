// The AVX-512 BF16 mode (Isa::avx512bf16: KVFLEET_CPU_ISA=avx512bf16 or set_cpu_isa, never chosen on its
// own): bf16 weights times activations rounded to bf16, one `vdpbf16ps` per 32 elements. Each lane j of a
// block takes x[2j] * w[2j] + x[2j + 1] * w[2j + 1] in one instruction (the pair order of bf16 weights in
// linear_kernels.h), then the same fixed lane tree. Rounding x to bf16 changes the results beyond the
// float64 reference tolerance of the default path (docs/cpu_backend.md), so this is a mode; but a row's
// result still depends on nothing but its own x and the weights (the 1-row and the N-row paths run the
// same instructions per element), so batch invariance holds within the mode.
// This file alone is built with -mavx512bf16 (kernels/CMakeLists.txt); like linear_avx512.cpp it calls no
// inline function of a shared header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/cpu/linear_kernels.h"

namespace kvfleet::cpu::detail {
namespace {

inline float reduce(__m512 v) {
  const __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
  const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
  return _mm_cvtss_f32(_mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1)));
}

const std::uint8_t* feature(const GemmArgs& g, std::int64_t n) {
  return g.w + static_cast<std::size_t>(n / kPanel) * g.panel_bytes + static_cast<std::size_t>(n % kPanel) * g.feature_bytes;
}

// x is arrange_bf16's: kp bf16 per row, i.e. kp / 2 floats' worth of bytes.
template <int M, int N>
void tile(const GemmArgs& g, std::int64_t t0, std::int64_t n0) {
  __m512 acc[M][N];
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) acc[m][n] = _mm512_setzero_ps();
  const std::uint8_t* w[N];
  for (int n = 0; n < N; ++n) w[n] = feature(g, n0 + n);
  const auto* x = reinterpret_cast<const std::uint16_t*>(g.xa) + t0 * g.kp;
  const std::int64_t kp = g.kp;
  const std::size_t step = g.block_step;
  std::int64_t b = 0;
  for (; b < g.full; b += kBlock) {
    __m512i wv[N];
    for (int n = 0; n < N; ++n) wv[n] = _mm512_loadu_si512(w[n]);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * kp + b);
      for (int n = 0; n < N; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, (__m512bh)wv[n]);
    }
    for (int n = 0; n < N; ++n) w[n] += step;
  }
  if (b < kp) {  // the tail of a plain row: the valid elements, zeros after
    const __mmask32 valid = static_cast<__mmask32>((1ull << (g.in - b)) - 1);
    __m512i wv[N];
    for (int n = 0; n < N; ++n) wv[n] = _mm512_maskz_loadu_epi16(valid, w[n]);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * kp + b);
      for (int n = 0; n < N; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, (__m512bh)wv[n]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) g.y[(t0 + m) * g.ldy + n0 + n] = reduce(acc[m][n]);
}

constexpr int kM = 6, kN = 4, kGemvN = 8;
constexpr std::int64_t kChunk = 64;

template <int M>
void features(const GemmArgs& g, std::int64_t t, std::int64_t c0, std::int64_t c1) {
  std::int64_t n = c0;
  for (; n + kN <= c1; n += kN) tile<M, kN>(g, t, n);
  for (; n < c1; ++n) tile<M, 1>(g, t, n);
}

}  // namespace

void gemm_avx512bf16(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  if (g.rows == 1) {
    std::int64_t n = n0;
    for (; n + kGemvN <= n1; n += kGemvN) tile<1, kGemvN>(g, 0, n);
    for (; n < n1; ++n) tile<1, 1>(g, 0, n);
    return;
  }
  for (std::int64_t c0 = n0; c0 < n1; c0 += kChunk) {
    const std::int64_t c1 = c0 + kChunk < n1 ? c0 + kChunk : n1;
    // Row tiles as even as possible (8 rows: 4 + 4, not 6 + 2): a short tile re-reads the chunk's
    // weights for few rows. Which tile a row falls in never changes its bits.
    const std::int64_t tiles = (g.rows + kM - 1) / kM, base = g.rows / tiles, extra = g.rows % tiles;
    for (std::int64_t i = 0, t = 0; i < tiles; ++i) {
      const std::int64_t m = base + (i < extra ? 1 : 0);
      switch (m) {
        case 6: features<6>(g, t, c0, c1); break;
        case 5: features<5>(g, t, c0, c1); break;
        case 4: features<4>(g, t, c0, c1); break;
        case 3: features<3>(g, t, c0, c1); break;
        case 2: features<2>(g, t, c0, c1); break;
        default: features<1>(g, t, c0, c1); break;
      }
      t += m;
    }
  }
}

}  // namespace kvfleet::cpu::detail
