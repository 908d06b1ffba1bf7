// The AVX2 + FMA kernel (x86-64-v3, the project's baseline flags). The 16 lanes of linear_kernels.h are
// two 8-lane registers: lanes 0-7 and 8-15.
#include <immintrin.h>

#include "kernels/cpu/linear_kernels.h"

namespace kvfleet::cpu::detail {
namespace {

struct Half {
  __m256 a, b;  // lanes 0-7, lanes 8-15
};

// The weights of one full block (blk: its first element), half 0 (lo) or 1 (hi), in lane order.
inline Half load_half(const std::uint8_t* blk, DType dt, int half) {
  if (dt == DType::bf16) {
    const auto* p = reinterpret_cast<const __m256i*>(blk);
    const __m256i v0 = _mm256_loadu_si256(p), v1 = _mm256_loadu_si256(p + 1);
    if (half == 0) return {_mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16))};
    const __m256i m = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    return {_mm256_castsi256_ps(_mm256_and_si256(v0, m)), _mm256_castsi256_ps(_mm256_and_si256(v1, m))};
  }
  if (dt == DType::f16) {
    const auto* p = reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint16_t*>(blk) + 16 * half);
    return {_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_cvtph_ps(_mm_loadu_si128(p + 1))};
  }
  const float* p = reinterpret_cast<const float*>(blk) + 16 * half;
  return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}

inline float reduce(__m256 a, __m256 b) {
  const __m256 r8 = _mm256_add_ps(a, b);
  const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
  const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
  return _mm_cvtss_f32(_mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1)));
}

// M rows x N features; the tail block's weights come from block_weights.
template <int M, int N>
void tile(const GemmArgs& g, std::int64_t t0, std::int64_t n0) {
  __m256 acc[M][N][2];
  for (auto& r : acc)
    for (auto& c : r) c[0] = c[1] = _mm256_setzero_ps();
  const std::uint8_t* rows[N];
  for (int n = 0; n < N; ++n)
    rows[n] = g.w + static_cast<std::size_t>((n0 + n) / kPanel) * g.panel_bytes +
              static_cast<std::size_t>((n0 + n) % kPanel) * g.feature_bytes;
  const std::int64_t full = g.full;
  for (std::int64_t b = 0; b < g.kp; b += kBlock) {
    alignas(32) float tail[N][2][kLanes];
    if (b >= full)
      for (int n = 0; n < N; ++n) block_weights(rows[n], g.dtype, g.in - b, tail[n][0], tail[n][1]);
    for (int half = 0; half < 2; ++half) {
      Half w[N];
      for (int n = 0; n < N; ++n)
        w[n] = b < full ? load_half(rows[n], g.dtype, half)
                        : Half{_mm256_load_ps(tail[n][half]), _mm256_load_ps(tail[n][half] + 8)};
      for (int m = 0; m < M; ++m) {
        const float* x = g.xa + (t0 + m) * g.kp + b + 16 * half;
        const __m256 xa = _mm256_loadu_ps(x), xb = _mm256_loadu_ps(x + 8);
        for (int n = 0; n < N; ++n) {
          acc[m][n][0] = _mm256_fmadd_ps(xa, w[n].a, acc[m][n][0]);
          acc[m][n][1] = _mm256_fmadd_ps(xb, w[n].b, acc[m][n][1]);
        }
      }
    }
    for (auto& r : rows) r += g.block_step;
  }
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) g.y[(t0 + m) * g.ldy + n0 + n] = reduce(acc[m][n][0], acc[m][n][1]);
}

template <int N>
void rows_of(const GemmArgs& g, std::int64_t n0) {
  std::int64_t t = 0;
  for (; t + 2 <= g.rows; t += 2) tile<2, N>(g, t, n0);
  if (t < g.rows) tile<1, N>(g, t, n0);
}

}  // namespace

void gemm_avx2(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  std::int64_t n = n0;
  for (; n + 2 <= n1; n += 2) rows_of<2>(g, n);
  if (n < n1) rows_of<1>(g, n);
}

}  // namespace kvfleet::cpu::detail
