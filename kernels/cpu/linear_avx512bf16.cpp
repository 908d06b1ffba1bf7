// The AVX-512 BF16 mode (Isa::avx512bf16: KVFLEET_CPU_ISA=avx512bf16 or set_cpu_isa, never chosen on its
// own): bf16 weights times activations rounded to bf16, one `vdpbf16ps` per 32 elements. Each lane j of a
// block takes x[2j] * w[2j] + x[2j + 1] * w[2j + 1] in one instruction (the pair order of bf16 weights in
// linear_kernels.h), then the fixed lane tree of linear_kernels.h. Rounding x to bf16 changes the results
// beyond the float64 reference tolerance of the default path (docs/cpu_backend.md), so this is a mode; but
// a row's result still depends on nothing but its own x and the weights (every row count, tile and thread
// runs the same instructions per element, blocks in order), so batch invariance holds within the mode.
//
// Blocking (rows > 1): row tiles of up to kM rows (as even as possible); the thread's features in chunks of
// kChunk whose weights stay in L2 while every row tile sweeps them in tiles of kN features, the reduction
// innermost. x is laid out in tile order (arrange_bf16): block b of a tile's row m at tile + b * M + m * 32
// bf16, one contiguous stream a tile, one pointer with constant offsets. kM x kN = 6 x 4: 24 accumulators, 4
// weight registers, one x register. Groups of rows whose x stays in L2 (the exact kernel's) measured no
// faster here (Zen 5, 512 rows: 1 MiB groups 0.95-1.02x, 256-512 KiB groups no better): bf16 x is half
// the bytes, and one stream a tile that the hardware prefetcher follows from L3.
// This file alone is built with -mavx512bf16 (kernels/CMakeLists.txt); like linear_avx512.cpp it calls no
// inline function of a shared header (avx512_reduce.h has internal linkage).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/cpu/avx512_reduce.h"
#include "kernels/cpu/linear_kernels.h"

namespace kvfleet::cpu::detail {
namespace {

constexpr int kM = 6, kN = 4, kGemvN = 8;
constexpr std::int64_t kChunk = 64;  // features whose weights stay in L2 while every row tile sweeps them

// Row tiles: ceil(rows / kM) tiles as even as possible (8 rows: 4 + 4). arrange_bf16 and the GEMM agree on it;
// which tile a row falls in never changes its bits.
struct RowTiles {
  std::int64_t count, base, extra;
  explicit RowTiles(std::int64_t rows) : count((rows + kM - 1) / kM), base(rows / count), extra(rows % count) {}
  std::int64_t rows_of(std::int64_t i) const { return base + (i < extra ? 1 : 0); }
  std::int64_t first_row(std::int64_t i) const { return i * base + (i < extra ? i : extra); }
};

const std::uint8_t* feature(const GemmArgs& g, std::int64_t n) {
  return g.w + static_cast<std::size_t>(n / kPanel) * g.panel_bytes + static_cast<std::size_t>(n % kPanel) * g.feature_bytes;
}

// f32_to_bf16 (dtype.h) on 16 lanes: round to nearest even, NaN kept quiet; the same bits as the scalar.
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// M rows x N features from row t0, feature n0 (x of the tile: block b of row m at x + b * M + m * kBlock).
template <int M, int N>
void tile(const GemmArgs& g, std::int64_t t0, std::int64_t n0) {
  __m512 acc[M][N];
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) acc[m][n] = _mm512_setzero_ps();
  const std::uint8_t* w[N];
  for (int n = 0; n < N; ++n) w[n] = feature(g, n0 + n);
  const auto* x = reinterpret_cast<const std::uint16_t*>(g.xa) + t0 * g.kp;
  const std::size_t step = g.block_step;
  std::int64_t b = 0;
  for (; b < g.full; b += kBlock) {
    __m512i wv[N];
    for (int n = 0; n < N; ++n) wv[n] = _mm512_loadu_si512(w[n]);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * kBlock);
      for (int n = 0; n < N; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, (__m512bh)wv[n]);
    }
    for (int n = 0; n < N; ++n) w[n] += step;
    x += M * kBlock;
  }
  if (b < g.kp) {  // the tail of a plain row: the valid elements, zeros after
    const __mmask32 valid = static_cast<__mmask32>((1ull << (g.in - b)) - 1);
    __m512i wv[N];
    for (int n = 0; n < N; ++n) wv[n] = _mm512_maskz_loadu_epi16(valid, w[n]);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * kBlock);
      for (int n = 0; n < N; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, (__m512bh)wv[n]);
    }
  }
  for (int m = 0; m < M; ++m) {
    float* y = g.y + (t0 + m) * g.ldy + n0;
    if constexpr (N % 4 == 0) {
      for (int n = 0; n < N; n += 4) reduce4(acc[m][n], acc[m][n + 1], acc[m][n + 2], acc[m][n + 3], y + n);
    } else {
      for (int n = 0; n < N; ++n) y[n] = reduce(acc[m][n]);
    }
  }
}

// One row on packed panels: two panels side by side, one pointer and one load per feature block a panel (the
// exact kernel's reading pattern on AMD, linear_avx512.cpp; the tile's 8 pointers decoded 0.91-0.98x as
// fast, Zen 5). Each feature's arithmetic is tile<1, 8>'s (a vdpbf16ps a block, in order, then reduce4 over
// features 0-3 and 4-7), so the bits are the same. Panels first[0..S); y of panel s at y[s] (valid[s] written).
template <int S>
void gemv_panels(const GemmArgs& g, const std::uint8_t* const* first, float* const* y, const std::int64_t* valid) {
  __m512 acc[S][kPanel];
  for (int s = 0; s < S; ++s)
    for (int n = 0; n < kPanel; ++n) acc[s][n] = _mm512_setzero_ps();
  const std::uint8_t* w[S];
  for (int s = 0; s < S; ++s) w[s] = first[s];
  const auto* x = reinterpret_cast<const std::uint16_t*>(g.xa);
  const std::size_t step = g.block_step, fb = g.feature_bytes;
  for (std::int64_t b = 0; b < g.full; b += kBlock) {
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + b);
    for (int s = 0; s < S; ++s)
      for (int n = 0; n < kPanel; ++n)
        acc[s][n] = _mm512_dpbf16_ps(acc[s][n], xv, (__m512bh)_mm512_loadu_si512(w[s] + n * fb));
    for (int s = 0; s < S; ++s) w[s] += step;
  }
  for (int s = 0; s < S; ++s) {
    alignas(16) float out[kPanel];
    reduce4(acc[s][0], acc[s][1], acc[s][2], acc[s][3], out);
    reduce4(acc[s][4], acc[s][5], acc[s][6], acc[s][7], out + 4);
    for (std::int64_t n = 0; n < valid[s]; ++n) y[s][n] = out[n];
  }
}

// Features [n0, n1) of one row on packed panels (n0 a panel's first feature): the thread's panels [p0, p1) as
// the pairs (p0 + i, p0 + half + i), an odd last one alone.
void gemv_packed(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  const std::int64_t p0 = n0 / kPanel, p1 = (n1 + kPanel - 1) / kPanel, half = (p1 - p0) / 2;
  auto panel = [&](std::int64_t p) { return g.w + static_cast<std::size_t>(p) * g.panel_bytes; };
  auto valid = [&](std::int64_t p) { return n1 - p * kPanel < kPanel ? n1 - p * kPanel : kPanel; };
  for (std::int64_t i = 0; i < half; ++i) {
    const std::int64_t a = p0 + i, b = p0 + half + i;
    const std::uint8_t* first[2] = {panel(a), panel(b)};
    float* y[2] = {g.y + a * kPanel, g.y + b * kPanel};
    const std::int64_t v[2] = {valid(a), valid(b)};
    gemv_panels<2>(g, first, y, v);
  }
  for (std::int64_t p = p0 + 2 * half; p < p1; ++p) {
    const std::uint8_t* first[1] = {panel(p)};
    float* y[1] = {g.y + p * kPanel};
    const std::int64_t v[1] = {valid(p)};
    gemv_panels<1>(g, first, y, v);
  }
}

template <int M>
void features(const GemmArgs& g, std::int64_t t, std::int64_t c0, std::int64_t c1) {
  std::int64_t n = c0;
  for (; n + kN <= c1; n += kN) tile<M, kN>(g, t, n);
  for (; n < c1; ++n) tile<M, 1>(g, t, n);
}

void row_tile(std::int64_t m, const GemmArgs& g, std::int64_t t, std::int64_t c0, std::int64_t c1) {
  switch (m) {
    case 6: features<6>(g, t, c0, c1); break;
    case 5: features<5>(g, t, c0, c1); break;
    case 4: features<4>(g, t, c0, c1); break;
    case 3: features<3>(g, t, c0, c1); break;
    case 2: features<2>(g, t, c0, c1); break;
    default: features<1>(g, t, c0, c1); break;
  }
}

}  // namespace

void arrange_bf16(const float* x, std::int64_t rows, std::int64_t in, std::int64_t kp, float* xa) {
  auto* out = reinterpret_cast<std::uint16_t*>(xa);
  const RowTiles tiles(rows);
  for (std::int64_t i = 0; i < tiles.count; ++i) {
    const std::int64_t t0 = tiles.first_row(i), m_rows = tiles.rows_of(i);
    for (std::int64_t m = 0; m < m_rows; ++m) {
      const float* src = x + (t0 + m) * in;
      for (std::int64_t b = 0; b < kp; b += kBlock) {
        std::uint16_t* dst = out + t0 * kp + b * m_rows + m * kBlock;
        for (std::int64_t h = 0; h < kBlock; h += 16) {
          const std::int64_t left = in - b - h;
          const __mmask16 valid = left >= 16 ? __mmask16(0xffff) : left > 0 ? static_cast<__mmask16>((1u << left) - 1) : 0;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + h), to_bf16(_mm512_maskz_loadu_ps(valid, src + b + h)));
        }
      }
    }
  }
}

void gemm_avx512bf16(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  if (g.rows == 1 && g.packed) {
    gemv_packed(g, n0, n1);
    return;
  }
  if (g.rows == 1) {
    std::int64_t n = n0;
    for (; n + kGemvN <= n1; n += kGemvN) tile<1, kGemvN>(g, 0, n);
    for (; n < n1; ++n) tile<1, 1>(g, 0, n);
    return;
  }
  const RowTiles tiles(g.rows);
  for (std::int64_t c0 = n0; c0 < n1; c0 += kChunk) {
    const std::int64_t c1 = c0 + kChunk < n1 ? c0 + kChunk : n1;
    for (std::int64_t i = 0; i < tiles.count; ++i) row_tile(tiles.rows_of(i), g, tiles.first_row(i), c0, c1);
  }
}

}  // namespace kvfleet::cpu::detail
