// The AVX-512 kernel (F + BW + VL + DQ; this file alone is compiled with those flags, kernels/CMakeLists.txt,
// and runs only where cpu_isa() found them). One zmm register holds the 16 lanes of linear_kernels.h.
// A bf16 block is a single 64-byte load: its even elements are the 32-bit words shifted left by 16, its odd
// ones the words masked, so widening costs two integer operations per 32 weights, shared by the M rows of
// a tile. This file calls no inline function of a shared header: such a function compiled here could be
// the copy the linker keeps for every caller, and would then need AVX-512 everywhere.
// GCC 12 warns about the deliberately undefined source register inside its own AVX-512 intrinsics
// (_mm512_undefined_ps in cvtph/extract): a false positive that -Werror would make fatal.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/cpu/linear_kernels.h"

namespace kvfleet::cpu::detail {
namespace {

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

}  // namespace kvfleet::cpu::detail
