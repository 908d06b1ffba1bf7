// The AVX-512 kernel (F + BW + VL + DQ; this file alone is compiled with those flags, kernels/CMakeLists.txt,
// and runs only where cpu_isa() found them). One zmm register holds the 16 lanes of linear_kernels.h.
// A bf16 block is a single 64-byte load: its even elements are the 32-bit words shifted left by 16, its odd
// ones the words masked, so widening costs two integer operations per 32 weights, shared by the M rows of
// a tile. This file calls no inline function of a shared header: such a function compiled here could be
// the copy the linker keeps for every caller, and would then need AVX-512 everywhere.
//
// Blocking (rows > 1): the row tiles go in groups of ~1 MiB of x; for each group, the thread's features
// go in chunks of kChunk (their weights, 48-128 KiB of bf16, stay in L2); for each chunk every row tile
// of kM rows of the group sweeps the chunk in tiles of kN features, the reduction innermost. So a weight
// is read from memory once per call (from L2/L3 once per group), and a row tile's x (kM rows, in L1/L2,
// laid out by arrange_tiled) is reused by the whole chunk. kM x kN = 6 x 4 = 24 accumulators + 4 weight
// registers. (8 x 3 and 12 x 2 widen fewer weight vectors per FMA but load more x: measured 5-35% slower,
// most at K = 2048, whose 8-12 rows of x no longer fit in L1; widening a chunk's weights to fp32 once
// for all row tiles was no faster at 128-512 rows and slower at 8: docs/cpu_backend.md.)
// GCC 12 warns about the deliberately undefined source register inside its own AVX-512 intrinsics
// (_mm512_undefined_ps in cvtph/extract): a false positive that -Werror would make fatal.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/avx512_reduce.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/linear_kernels.h"

namespace kvfleet::cpu::detail {
namespace {

// Half 0 (lo) or 1 (hi) of a full block (blk: its first element), in lane order.
template <DType Dt, int Half>
inline __m512 load_half(const std::uint8_t* blk) {
  if constexpr (Dt == DType::bf16) {
    const __m512i v = _mm512_loadu_si512(blk);
    if constexpr (Half == 0) return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    else return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  } else if constexpr (Dt == DType::f16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk) + Half));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(blk) + 16 * Half);
  }
}

const std::uint8_t* feature(const GemmArgs& g, std::int64_t n) {
  return g.w + static_cast<std::size_t>(n / kPanel) * g.panel_bytes + static_cast<std::size_t>(n % kPanel) * g.feature_bytes;
}

// One row (GEMV) is memory-bound. Measured on one thread by CPU time (bf16, 2048 columns): 8 weight rows
// side by side, each prefetched by software 4 blocks (256 bytes of bf16) ahead, read 5-13% faster from
// memory (512 MiB) than 16 rows with the hardware prefetcher alone, and ~5% faster from L2 (3 MiB); 16
// rows with the same prefetch lost 10-15% from L2 (twice the prefetches and loads per FMA).
// Packed panels are one stream (a panel's 8 features block by block): there 4 blocks ahead is only 2 KiB
// of that stream, and the packed GEMV read 4-12% slower than plain rows; prefetching each line 8 blocks
// ahead into L1 and 32 blocks (16 KiB of bf16) ahead into L2 read 5-15% faster than plain rows on one
// thread (docs/cpu_backend.md).
constexpr std::size_t kAhead = 4;
// Packed panels: blocks ahead into L1 and into L2 (set_packed_prefetch: benchmarks try others in-process;
// read with the compiler's atomic built-ins, not std::atomic's inline members: see the top of the file).
std::uint32_t g_ahead_packed = 8, g_ahead_packed_l2 = 32;

template <DType Dt, bool L2 = false>
inline void prefetch_block(const std::uint8_t* p) {  // may point past the weights: a prefetch never faults
  const char* c = reinterpret_cast<const char*>(p);
  if constexpr (L2) {
    _mm_prefetch(c, _MM_HINT_T1);
    if constexpr (Dt == DType::f32) _mm_prefetch(c + 64, _MM_HINT_T1);
  } else {
    _mm_prefetch(c, _MM_HINT_T0);
    if constexpr (Dt == DType::f32) _mm_prefetch(c + 64, _MM_HINT_T0);
  }
}

// M rows x N features from row t0, feature n0; the reduction loop innermost, no branch inside it (the
// dtype is a template argument). Per half-block, the N weight vectors are widened once and each x vector
// is loaded once for the N features; per accumulator the order stays lo then hi, block by block.
template <DType Dt, int M, int N, bool Prefetch = (M == 1)>
void tile(const GemmArgs& g, std::int64_t t0, std::int64_t n0) {
  __m512 acc[M][N];
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) acc[m][n] = _mm512_setzero_ps();
  const std::uint8_t* w[N];
  for (int n = 0; n < N; ++n) w[n] = feature(g, n0 + n);
  // x in row tiles (arrange_tiled): block b of the tile's row m is at x + b * M + m * 32, one pointer and
  // constant offsets (with a pointer per row, GCC ran out of general registers and spilled every block).
  const float* x = g.xa + t0 * g.kp;
  const std::size_t step = g.block_step;
  // Prefetch (the GEMV, and every tile on packed panels): each weight line prefetched ahead into L1, and on
  // packed panels (one stream) further ahead into L2 too.
  const std::size_t ahead = (g.packed ? __atomic_load_n(&g_ahead_packed, __ATOMIC_RELAXED) : kAhead) * step;
  const std::size_t ahead_l2 = g.packed ? __atomic_load_n(&g_ahead_packed_l2, __ATOMIC_RELAXED) * step : 0;
  std::int64_t b = 0;
  for (; b < g.full; b += kBlock) {
    __m512 lo[N], hi[N];
    if constexpr (Prefetch) {
      if (ahead)
        for (int n = 0; n < N; ++n) prefetch_block<Dt>(w[n] + ahead);
      if (ahead_l2)
        for (int n = 0; n < N; ++n) prefetch_block<Dt, true>(w[n] + ahead_l2);
    }
    for (int n = 0; n < N; ++n) lo[n] = load_half<Dt, 0>(w[n]);
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * kBlock);
      for (int n = 0; n < N; ++n) acc[m][n] = _mm512_fmadd_ps(xv, lo[n], acc[m][n]);
    }
    for (int n = 0; n < N; ++n) hi[n] = load_half<Dt, 1>(w[n]);
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * kBlock + kLanes);
      for (int n = 0; n < N; ++n) acc[m][n] = _mm512_fmadd_ps(xv, hi[n], acc[m][n]);
    }
    for (int n = 0; n < N; ++n) w[n] += step;
    x += M * kBlock;
  }
  if (b < g.kp) {  // the tail of a plain row
    alignas(64) float tail[N][2][kLanes];
    for (int n = 0; n < N; ++n) block_weights(w[n], Dt, g.in - b, tail[n][0], tail[n][1]);
    for (int m = 0; m < M; ++m) {
      const __m512 xl = _mm512_loadu_ps(x + m * kBlock), xh = _mm512_loadu_ps(x + m * kBlock + kLanes);
      for (int n = 0; n < N; ++n)
        acc[m][n] = _mm512_fmadd_ps(xh, _mm512_load_ps(tail[n][1]), _mm512_fmadd_ps(xl, _mm512_load_ps(tail[n][0]), acc[m][n]));
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

// One row on packed panels (the GEMV), a panel of 8 features at a time: each feature's block is widened and
// multiplied exactly as tile<Dt, 1, 8> does it (lo then hi, block by block, then reduce4), so the bits are
// the same; only the reading differs. One base pointer per panel and one load per feature block (the tile
// keeps 8 pointers and loads a bf16 block once per half), and with 2 streams two panels side by side: the
// thread's panels [p0, p1) are read as the pairs (p0 + i, p0 + half + i), an odd last panel alone. Measured
// on the AMD EPYC (Zen 5) VM, a 125M token's linear calls (bench_matvec --chain, median GB/s,
// docs/cpu_backend.md): 1 thread tile 19.7, one panel at a time 25.5, two panels 27.1;
// 2 threads tile 31.1, two panels 37.1, two panels prefetching 4 blocks ahead into L1 38.3; the 1.6 GB
// model's, 2 threads: tile 39.9, two panels + 4 ahead 49.6 (1 thread 22.4 -> 27.3). Prefetching into L2 as the tile does lost 7-13%
// there. On an Intel Xeon VM (AVX-512 FP16) the tile's software prefetch was measured a
// gain, so the default is chosen per CPU (gemv_initial): two panels + 4 ahead on AMD family 1Ah (Zen 5);
// two panels and no software prefetch on AMD family 19h (Zen 4; Zen 3, the same family, has no AVX-512),
// where any prefetch lost (docs/cpu_backend.md: 125M, 2 threads, tile 35.8, two panels 42.3,
// + 1 block into L1 35.0, + 16 into L2 35.9 GB/s; the 1.6 GB model's 28.9 -> 31.7); the tile elsewhere.
// KVFLEET_CPU_GEMV=tile|1|2 forces one; set_packed_gemv for A/B runs.
constexpr std::uint32_t kUnset = ~0u;
std::uint32_t g_gemv_streams = kUnset, g_gemv_l1 = 0, g_gemv_l2 = 0;

void gemv_initial() {
  std::uint32_t streams = 0, l1 = 0, l2 = 0;
  const char* env = std::getenv("KVFLEET_CPU_GEMV");
  if (env && std::strcmp(env, "tile") == 0) streams = 0;
  else if (env && std::strcmp(env, "1") == 0) streams = 1;
  else if (env && std::strcmp(env, "2") == 0) streams = 2;
  else if (const CpuModel m = cpu_model(); m.amd && m.family >= 0x19) streams = 2, l1 = m.family >= 0x1a ? 4 : 0;
  std::uint32_t unset = kUnset;  // set_packed_gemv before the first call wins
  if (__atomic_compare_exchange_n(&g_gemv_streams, &unset, streams, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    __atomic_store_n(&g_gemv_l1, l1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_gemv_l2, l2, __ATOMIC_RELAXED);
  }
}

std::uint32_t gemv_streams() {
  std::uint32_t s = __atomic_load_n(&g_gemv_streams, __ATOMIC_RELAXED);
  if (s == kUnset) {
    gemv_initial();
    s = __atomic_load_n(&g_gemv_streams, __ATOMIC_RELAXED);
  }
  return s;
}

template <DType Dt>
inline void load_pair(const std::uint8_t* blk, __m512& lo, __m512& hi) {
  if constexpr (Dt == DType::bf16) {
    const __m512i v = _mm512_loadu_si512(blk);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  } else {
    lo = load_half<Dt, 0>(blk);
    hi = load_half<Dt, 1>(blk);
  }
}

inline void prefetch_panel_block(const std::uint8_t* p, std::size_t bytes, int hint) {  // a block of all 8 features
  for (std::size_t o = 0; o < bytes; o += 64) {
    if (hint == 0) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
    else _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T1);
  }
}

// Panels first[0..S) side by side; y of panel s at y[s] (only the first valid[s] features are written).
template <DType Dt, int S>
void gemv_panels(const GemmArgs& g, const std::uint8_t* const* first, float* const* y, const std::int64_t* valid) {
  __m512 acc[S][kPanel];
  for (int s = 0; s < S; ++s)
    for (int n = 0; n < kPanel; ++n) acc[s][n] = _mm512_setzero_ps();
  const std::uint8_t* w[S];
  for (int s = 0; s < S; ++s) w[s] = first[s];
  const float* x = g.xa;
  const std::size_t step = g.block_step, fb = g.feature_bytes;
  const std::size_t l1 = __atomic_load_n(&g_gemv_l1, __ATOMIC_RELAXED) * step;
  const std::size_t l2 = __atomic_load_n(&g_gemv_l2, __ATOMIC_RELAXED) * step;
  for (std::int64_t b = 0; b < g.full; b += kBlock) {
    if (l1)
      for (int s = 0; s < S; ++s) prefetch_panel_block(w[s] + l1, step, 0);
    if (l2)
      for (int s = 0; s < S; ++s) prefetch_panel_block(w[s] + l2, step, 1);
    const __m512 xl = _mm512_loadu_ps(x), xh = _mm512_loadu_ps(x + kLanes);
    for (int s = 0; s < S; ++s)
      for (int n = 0; n < kPanel; ++n) {
        __m512 lo, hi;
        load_pair<Dt>(w[s] + n * fb, lo, hi);
        acc[s][n] = _mm512_fmadd_ps(xh, hi, _mm512_fmadd_ps(xl, lo, acc[s][n]));
      }
    for (int s = 0; s < S; ++s) w[s] += step;
    x += kBlock;
  }
  for (int s = 0; s < S; ++s) {
    alignas(16) float out[kPanel];
    reduce4(acc[s][0], acc[s][1], acc[s][2], acc[s][3], out);
    reduce4(acc[s][4], acc[s][5], acc[s][6], acc[s][7], out + 4);
    for (std::int64_t n = 0; n < valid[s]; ++n) y[s][n] = out[n];
  }
}

template <DType Dt>
void gemv_packed(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  const std::int64_t p0 = n0 / kPanel, p1 = (n1 + kPanel - 1) / kPanel;  // n0 is a panel's first feature
  auto panel = [&](std::int64_t p) { return g.w + static_cast<std::size_t>(p) * g.panel_bytes; };
  auto valid = [&](std::int64_t p) { return n1 - p * kPanel < kPanel ? n1 - p * kPanel : kPanel; };
  std::int64_t done = p0;
  if (gemv_streams() >= 2) {
    const std::int64_t half = (p1 - p0) / 2;
    for (std::int64_t i = 0; i < half; ++i) {
      const std::int64_t a = p0 + i, b = p0 + half + i;
      const std::uint8_t* first[2] = {panel(a), panel(b)};
      float* y[2] = {g.y + a * kPanel, g.y + b * kPanel};
      const std::int64_t v[2] = {valid(a), valid(b)};
      gemv_panels<Dt, 2>(g, first, y, v);
    }
    done = p0 + 2 * half;
  }
  for (std::int64_t p = done; p < p1; ++p) {
    const std::uint8_t* first[1] = {panel(p)};
    float* y[1] = {g.y + p * kPanel};
    const std::int64_t v[1] = {valid(p)};
    gemv_panels<Dt, 1>(g, first, y, v);
  }
}

constexpr int kM = 6, kN = 4;
constexpr int kGemvN = 8;              // one row on plain rows: 8 features (weight streams) side by side
constexpr std::int64_t kChunk = 64;    // features whose weights stay in L2 while every row tile sweeps them

// KVFLEET_CPU_GEMV=16 (read once): the previous GEMV, 16 streams and no software prefetch, for A/B runs on
// two threads, where the difference was measured only at high load (docs/cpu_backend.md). Same bits.
bool gemv16() {
  static const bool on = [] {
    const char* env = std::getenv("KVFLEET_CPU_GEMV");
    return env && std::strcmp(env, "16") == 0;
  }();
  return on;
}

// The row tiles of a call: ceil(rows / kM) tiles as even as possible (8 rows: 4 + 4, not 6 + 2: a short
// tile re-reads the chunk's weights for few rows). Tile i has rows_of(i) rows from first_row(i). Which
// tile a row falls in never changes its bits; arrange_tiled and gemm must agree on it.
struct RowTiles {
  std::int64_t count, base, extra;
  explicit RowTiles(std::int64_t rows) : count((rows + kM - 1) / kM), base(rows / count), extra(rows % count) {}
  std::int64_t rows_of(std::int64_t i) const { return base + (i < extra ? 1 : 0); }
  std::int64_t first_row(std::int64_t i) const { return i * base + (i < extra ? i : extra); }
};

// Row blocks: the row tiles go in groups whose x (kp floats a row) fits in ~1 MiB, and each group sweeps
// all of the thread's chunks before the next starts, so x stays in L2 (2 MiB a core here) beside a
// chunk's weights: a 512-token prompt at K = 2048 has 4 MiB of x, which the plain chunk loop re-read
// from L3 for every chunk. The weights are then re-read once per group (a small cost against the
// arithmetic: the group's rows use each weight ~100 times). Only the order of the tiles changes.
constexpr std::int64_t kXBlockBytes = 1 << 20;

template <DType Dt, int M, bool Prefetch>
void features(const GemmArgs& g, std::int64_t t, std::int64_t c0, std::int64_t c1) {
  std::int64_t n = c0;
  for (; n + kN <= c1; n += kN) tile<Dt, M, kN, Prefetch>(g, t, n);
  for (; n < c1; ++n) tile<Dt, M, 1, Prefetch>(g, t, n);
}

// One row tile of m rows over features [c0, c1).
template <DType Dt, bool Prefetch>
void row_tile(std::int64_t m, const GemmArgs& g, std::int64_t t, std::int64_t c0, std::int64_t c1) {
  switch (m) {
    case 6: features<Dt, 6, Prefetch>(g, t, c0, c1); break;
    case 5: features<Dt, 5, Prefetch>(g, t, c0, c1); break;
    case 4: features<Dt, 4, Prefetch>(g, t, c0, c1); break;
    case 3: features<Dt, 3, Prefetch>(g, t, c0, c1); break;
    case 2: features<Dt, 2, Prefetch>(g, t, c0, c1); break;
    default: features<Dt, 1, Prefetch>(g, t, c0, c1); break;
  }
}

template <DType Dt>
void gemm(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  if (g.rows == 1 && g.packed && !gemv16() && gemv_streams() > 0) {
    gemv_packed<Dt>(g, n0, n1);
    return;
  }
  if (g.rows == 1) {
    std::int64_t n = n0;
    if (gemv16())
      for (; n + 16 <= n1; n += 16) tile<Dt, 1, 16, false>(g, 0, n);
    for (; n + kGemvN <= n1; n += kGemvN) tile<Dt, 1, kGemvN>(g, 0, n);
    for (; n < n1; ++n) tile<Dt, 1, 1>(g, 0, n);
    return;
  }
  const RowTiles tiles(g.rows);
  // Packed panels: every tile prefetches its stream as the GEMV does (the tile on the packed copy without
  // it read 25-40% slower than plain rows from memory at 2-12 rows, and from L3 0-20% slower than with it).
  const bool prefetch = g.packed;
  const std::int64_t tile_bytes = kM * g.kp * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t group = kXBlockBytes / tile_bytes > 1 ? kXBlockBytes / tile_bytes : 1;
  for (std::int64_t i0 = 0; i0 < tiles.count; i0 += group) {
    const std::int64_t i1 = i0 + group < tiles.count ? i0 + group : tiles.count;
    for (std::int64_t c0 = n0; c0 < n1; c0 += kChunk) {
      const std::int64_t c1 = c0 + kChunk < n1 ? c0 + kChunk : n1;
      for (std::int64_t i = i0; i < i1; ++i) {
        if (prefetch) row_tile<Dt, true>(tiles.rows_of(i), g, tiles.first_row(i), c0, c1);
        else row_tile<Dt, false>(tiles.rows_of(i), g, tiles.first_row(i), c0, c1);
      }
    }
  }
}

}  // namespace

void arrange_tiled(const float* x, std::int64_t rows, std::int64_t in, std::int64_t kp, DType dt, float* xa) {
  const RowTiles tiles(rows);
  const bool pairs = dt == DType::bf16;  // linear_kernels.h: lane j takes elements 2j and 2j + 1
  for (std::int64_t i = 0; i < tiles.count; ++i) {
    const std::int64_t t0 = tiles.first_row(i), m_rows = tiles.rows_of(i);
    for (std::int64_t m = 0; m < m_rows; ++m) {
      const float* src = x + (t0 + m) * in;
      for (std::int64_t b = 0; b < kp; b += kBlock) {
        float* dst = xa + t0 * kp + b * m_rows + m * kBlock;
        if (b + kBlock <= in) {  // a full block: no bound checks (the copy runs on one thread per call)
          if (pairs) {
            for (std::int64_t j = 0; j < kLanes; ++j) dst[j] = src[b + 2 * j];
            for (std::int64_t j = 0; j < kLanes; ++j) dst[kLanes + j] = src[b + 2 * j + 1];
          } else {
            for (std::int64_t j = 0; j < kBlock; ++j) dst[j] = src[b + j];
          }
          continue;
        }
        for (std::int64_t j = 0; j < kBlock; ++j) {
          const std::int64_t e = b + (pairs ? (j < kLanes ? 2 * j : 2 * (j - kLanes) + 1) : j);
          dst[j] = e < in ? src[e] : 0.0f;
        }
      }
    }
  }
}

void set_packed_prefetch(std::uint32_t l1_blocks, std::uint32_t l2_blocks) {
  __atomic_store_n(&g_ahead_packed, l1_blocks, __ATOMIC_RELAXED);
  __atomic_store_n(&g_ahead_packed_l2, l2_blocks, __ATOMIC_RELAXED);
}

void set_packed_gemv(std::uint32_t streams, std::uint32_t l1_blocks, std::uint32_t l2_blocks) {
  __atomic_store_n(&g_gemv_l1, l1_blocks, __ATOMIC_RELAXED);
  __atomic_store_n(&g_gemv_l2, l2_blocks, __ATOMIC_RELAXED);
  __atomic_store_n(&g_gemv_streams, streams > 2 ? 2 : streams, __ATOMIC_RELAXED);
}

void packed_gemv(std::uint32_t& streams, std::uint32_t& l1_blocks, std::uint32_t& l2_blocks) {
  streams = gemv_streams();
  l1_blocks = __atomic_load_n(&g_gemv_l1, __ATOMIC_RELAXED);
  l2_blocks = __atomic_load_n(&g_gemv_l2, __ATOMIC_RELAXED);
}

void gemm_avx512(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  switch (g.dtype) {
    case DType::bf16: gemm<DType::bf16>(g, n0, n1); return;
    case DType::f16: gemm<DType::f16>(g, n0, n1); return;
    default: gemm<DType::f32>(g, n0, n1); return;
  }
}

}  // namespace kvfleet::cpu::detail
