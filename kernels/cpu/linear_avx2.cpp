// The AVX2 + FMA kernel (x86-64-v3, the project's baseline flags). The 16 lanes of linear_kernels.h are
// two 8-lane registers: lanes 0-7 and 8-15.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/linear_kernels.h"
#include "kvfleet/dtype.h"

namespace kvfleet::cpu::detail {
namespace {

struct Half {
  __m256 a, b;  // lanes 0-7, lanes 8-15
};

// Feature n's first block (linear_kernels.h's addressing).
inline const std::uint8_t* first_block(const GemmArgs& g, std::int64_t n) {
  return g.w + static_cast<std::size_t>(n / kPanel) * g.panel_bytes + static_cast<std::size_t>(n % kPanel) * g.feature_bytes;
}

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
  for (int n = 0; n < N; ++n) rows[n] = first_block(g, n0 + n);
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

// One row on packed panels (the GEMV, memory-bound). A panel's 8 features would need 16 accumulators, all
// of AVX2's registers, so a panel is read in two passes of 4 features (8 accumulators, 4 x vectors): memory
// sees the panel's stream about in order and the second pass reads the panel (12-32 KiB at K = 768-2048)
// from the caches. The first pass prefetches every line of the panel's block step `ahead` blocks in front
// of it (into L1); on the AMD EPYC (Zen 3) VM 2-64 blocks ahead lost (8.3-9.9 GB/s on one thread against
// 11.7-13.0), so the default is 0: the current block step's lines, all 8 features'. The tile above read a panel in four passes of 2 features, each touching 2 of every 8
// lines: 57% of the read bandwidth at batch 1 there (docs/cpu_backend.md, docs/cpu_backend.md). Per lane the
// order is the tile's (lo then hi, block by block; reduce's tree): same bits.
constexpr int kUnset = -1000;  // a knob not yet read from its environment variable
std::atomic<int> g_gemv_ahead{kUnset};  // blocks; -1: the tile

// A knob's value: what set_avx2_* stored, else `parse` of its environment variable (read once).
int knob(std::atomic<int>& v, const char* env, int (*parse)(const char*)) {
  if (const int x = v.load(std::memory_order_relaxed); x != kUnset) return x;
  int unset = kUnset;
  v.compare_exchange_strong(unset, parse(std::getenv(env)), std::memory_order_relaxed);
  return v.load(std::memory_order_relaxed);
}

int gemv_ahead() {  // KVFLEET_CPU_GEMV_AVX2: tile | a prefetch distance in blocks
  return knob(g_gemv_ahead, "KVFLEET_CPU_GEMV_AVX2", [](const char* e) {
    return !e ? 0 : std::strcmp(e, "tile") == 0 ? -1 : std::max(0, std::atoi(e));
  });
}

// KVFLEET_CPU_GEMM_AVX2 (read once; or set_avx2_gemm): how rows > 1 run, for A/B runs, all with the same
// bits: `tile` (0) one 2 x 2 tile over the whole weight, `3x2` (1) 3 x 2 tiles in row blocks and feature
// chunks at every row count (with the prefetch of the next chunk); unset (2) the same blocks with 3 x 3
// segmented tiles from kSegRows rows on (the default).
std::atomic<int> g_gemm_mode{kUnset};

int gemm_mode() {
  return knob(g_gemm_mode, "KVFLEET_CPU_GEMM_AVX2", [](const char* e) {
    return !e ? 2 : std::strcmp(e, "tile") == 0 ? 0 : std::strcmp(e, "3x2") == 0 ? 1 : 2;
  });
}

// A block's weights of one feature for lanes 8 * part .. 8 * part + 7: lo (Hi = 0, paired with
// x[b + 8 part + j]) or hi (Hi = 1, with x[b + 16 + 8 part + j]).
template <DType Dt, int Hi>
inline __m256 load_one(const std::uint8_t* blk, int part) {
  if constexpr (Dt == DType::bf16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk) + part);
    if constexpr (Hi == 0) return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    else return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  } else if constexpr (Dt == DType::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk) + 2 * Hi + part));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(blk) + 16 * Hi + 8 * part);
  }
}

// Features f0 .. f0 + 3 of the panel at `panel` into out[0..4); Prefetch: the first pass, which prefetches
// all 8 features' lines of the block step `ahead` bytes on, so with ahead 0 the lines of the second pass's
// 4 features are requested with the first pass's (skipping that prefetch read 0.91-0.98x as fast in
// bench_matvec --gemv-only 1).
template <DType Dt, bool Prefetch>
void gemv_quad(const GemmArgs& g, const std::uint8_t* panel, int f0, std::size_t ahead, float* out) {
  __m256 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  const std::size_t step = g.block_step, fb = g.feature_bytes;
  const std::uint8_t* w = panel + static_cast<std::size_t>(f0) * fb;
  const float* x = g.xa;
  for (std::int64_t b = 0; b < g.kp; b += kBlock, w += step, x += kBlock) {
    if constexpr (Prefetch)
      for (std::size_t o = 0; o < step; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(panel + ahead + o), _MM_HINT_T0);
    panel += step;
    const __m256 xl0 = _mm256_loadu_ps(x), xl1 = _mm256_loadu_ps(x + 8);
    const __m256 xh0 = _mm256_loadu_ps(x + 16), xh1 = _mm256_loadu_ps(x + 24);
    for (int n = 0; n < 4; ++n) {
      const std::uint8_t* blk = w + n * fb;
      acc[n][0] = _mm256_fmadd_ps(xl0, load_one<Dt, 0>(blk, 0), acc[n][0]);
      acc[n][0] = _mm256_fmadd_ps(xh0, load_one<Dt, 1>(blk, 0), acc[n][0]);
      acc[n][1] = _mm256_fmadd_ps(xl1, load_one<Dt, 0>(blk, 1), acc[n][1]);
      acc[n][1] = _mm256_fmadd_ps(xh1, load_one<Dt, 1>(blk, 1), acc[n][1]);
    }
  }
  for (int n = 0; n < 4; ++n) out[n] = reduce(acc[n][0], acc[n][1]);
}

template <DType Dt>
void gemv_packed(const GemmArgs& g, std::int64_t n0, std::int64_t n1, std::size_t ahead) {
  for (std::int64_t p = n0 / kPanel; p * kPanel < n1; ++p) {  // n0 is a panel's first feature
    const std::uint8_t* panel = g.w + static_cast<std::size_t>(p) * g.panel_bytes;
    float out[kPanel];
    gemv_quad<Dt, true>(g, panel, 0, ahead, out);  // ahead 0 still prefetches: see gemv_quad
    gemv_quad<Dt, false>(g, panel, 4, 0, out + 4);
    const std::int64_t valid = n1 - p * kPanel < kPanel ? n1 - p * kPanel : kPanel;
    for (std::int64_t n = 0; n < valid; ++n) g.y[p * kPanel + n] = out[n];
  }
}

// Rows > 1: M x N tiles with the dtype a template argument and no branch in the reduction loop (a plain
// row's partial last block, if any, after it). Per block, lane part p (lanes 8p .. 8p + 7) and half (lo, hi):
// N widened weight vectors, then each of the M rows' x vector once for the N features; M x N x 2
// accumulators. 3 x 2: 12 accumulators + 2 weights + the bf16 mask + 1 x of the 16 registers (lo and hi
// widened together spilled an accumulator every half-block); 24 FMAs to 24 loads a block
// (the 2 x 2 tile above: 16 FMAs to 12 loads, and a dtype switch and a tail test on every load).
template <DType Dt, int M, int N>
void tile_t(const GemmArgs& g, std::int64_t t0, std::int64_t n0) {
  __m256 acc[M][N][2];
  for (auto& r : acc)
    for (auto& c : r) c[0] = c[1] = _mm256_setzero_ps();
  const std::uint8_t* w[N];
  for (int n = 0; n < N; ++n) w[n] = first_block(g, n0 + n);
  const float* x = g.xa + t0 * g.kp;
  const std::size_t step = g.block_step;
  const std::int64_t kp = g.kp;
  std::int64_t b = 0;
  for (; b < g.full; b += kBlock) {
    for (int p = 0; p < 2; ++p) {
      __m256 v[N];  // lo, then hi (loaded again: a weight register fewer, no accumulator spilled)
      for (int n = 0; n < N; ++n) v[n] = load_one<Dt, 0>(w[n], p);
      for (int m = 0; m < M; ++m) {
        const __m256 xl = _mm256_loadu_ps(x + m * kp + b + 8 * p);
        for (int n = 0; n < N; ++n) acc[m][n][p] = _mm256_fmadd_ps(xl, v[n], acc[m][n][p]);
      }
      for (int n = 0; n < N; ++n) v[n] = load_one<Dt, 1>(w[n], p);
      for (int m = 0; m < M; ++m) {
        const __m256 xh = _mm256_loadu_ps(x + m * kp + b + 16 + 8 * p);
        for (int n = 0; n < N; ++n) acc[m][n][p] = _mm256_fmadd_ps(xh, v[n], acc[m][n][p]);
      }
    }
    for (int n = 0; n < N; ++n) w[n] += step;
  }
  if (b < kp) {  // a plain row's partial last block
    alignas(32) float tail[N][2][kLanes];
    for (int n = 0; n < N; ++n) block_weights(w[n], g.dtype, g.in - b, tail[n][0], tail[n][1]);
    for (int p = 0; p < 2; ++p)
      for (int m = 0; m < M; ++m) {
        const __m256 xl = _mm256_loadu_ps(x + m * kp + b + 8 * p), xh = _mm256_loadu_ps(x + m * kp + b + 16 + 8 * p);
        for (int n = 0; n < N; ++n)
          acc[m][n][p] = _mm256_fmadd_ps(xh, _mm256_load_ps(tail[n][1] + 8 * p),
                                         _mm256_fmadd_ps(xl, _mm256_load_ps(tail[n][0] + 8 * p), acc[m][n][p]));
      }
  }
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) g.y[(t0 + m) * g.ldy + n0 + n] = reduce(acc[m][n][0], acc[m][n][1]);
}

// M rows x N features with one lane part at a time. The K loop runs in segments of kSeg
// blocks; in each, lanes 0-7 (part 0) take the segment's blocks, then lanes 8-15 (part 1), each part's M x N
// accumulators parked in memory while the other runs. At 3 x 3 that is 9 accumulators, 3 widened weights,
// an x vector and the bf16 mask: no spill, where a 3 x 3 tile of both parts would need 18 accumulators.
// 12 loads to 18 FMAs a block part (the 3 x 2 tile: 24 to 24, with accumulators spilled and copied by the
// compiler). A segment's x and weights (3 rows x 32 blocks x 128 B, 3 features x 32 x 64 B at bf16) stay in
// L1 for the second part. Each lane still takes its blocks in order, lo then hi, and reduce gets lanes 0-7 and
// 8-15 as before: same bits. (3 x 4 and 4 x 3 need all 16 registers: GCC spilled accumulators in both, 0.74x
// and 0.95x the 3 x 2 tile; weights widened to f32 once per chunk for a spill-free 4 x 3 loop read more than
// they saved, 0.86x this tile: docs/cpu_backend.md.)
constexpr std::int64_t kSeg = 32;  // 8 and 16 blocks: 0.94x and 0.98x (prefill shapes, one thread)
constexpr std::int64_t kSegRows = 16;  // with the next chunk prefetched (sweep): batch 16 1.08x, batch 8 the
                                       // same (0.85x before that prefetch), fewer rows not measured: 3 x 2

template <DType Dt, int M, int N>
void tile_seg(const GemmArgs& g, std::int64_t t0, std::int64_t n0) {
  alignas(32) float park[2][M][N][8];  // written by the first segment (or the tail) before any read
  const std::uint8_t* w[N];
  for (int n = 0; n < N; ++n) w[n] = first_block(g, n0 + n);
  const float* x = g.xa + t0 * g.kp;
  const std::size_t step = g.block_step;
  const std::int64_t kp = g.kp, full = g.full;
  for (std::int64_t s = 0; s < full; s += kSeg * kBlock) {
    const std::int64_t e = std::min(full, s + kSeg * kBlock);
    for (int p = 0; p < 2; ++p) {
      __m256 acc[M][N];
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) acc[m][n] = s == 0 ? _mm256_setzero_ps() : _mm256_load_ps(park[p][m][n]);
      const std::uint8_t* wb[N];
      for (int n = 0; n < N; ++n) wb[n] = w[n];
      for (std::int64_t b = s; b < e; b += kBlock) {
        __m256 v[N];
        for (int n = 0; n < N; ++n) v[n] = load_one<Dt, 0>(wb[n], p);
        for (int m = 0; m < M; ++m) {
          const __m256 xl = _mm256_loadu_ps(x + m * kp + b + 8 * p);
          for (int n = 0; n < N; ++n) acc[m][n] = _mm256_fmadd_ps(xl, v[n], acc[m][n]);
        }
        for (int n = 0; n < N; ++n) v[n] = load_one<Dt, 1>(wb[n], p);
        for (int m = 0; m < M; ++m) {
          const __m256 xh = _mm256_loadu_ps(x + m * kp + b + 16 + 8 * p);
          for (int n = 0; n < N; ++n) acc[m][n] = _mm256_fmadd_ps(xh, v[n], acc[m][n]);
        }
        for (int n = 0; n < N; ++n) wb[n] += step;
      }
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) _mm256_store_ps(park[p][m][n], acc[m][n]);
    }
    for (int n = 0; n < N; ++n) w[n] += step * static_cast<std::size_t>((e - s) / kBlock);
  }
  if (full < kp) {  // a plain row's partial last block
    alignas(32) float tail[N][2][kLanes];
    for (int n = 0; n < N; ++n) block_weights(w[n], g.dtype, g.in - full, tail[n][0], tail[n][1]);
    for (int p = 0; p < 2; ++p)
      for (int m = 0; m < M; ++m) {
        const __m256 xl = _mm256_loadu_ps(x + m * kp + full + 8 * p);
        const __m256 xh = _mm256_loadu_ps(x + m * kp + full + 16 + 8 * p);
        for (int n = 0; n < N; ++n) {
          const __m256 prev = full == 0 ? _mm256_setzero_ps() : _mm256_load_ps(park[p][m][n]);
          const __m256 a = _mm256_fmadd_ps(xl, _mm256_load_ps(tail[n][0] + 8 * p), prev);
          _mm256_store_ps(park[p][m][n], _mm256_fmadd_ps(xh, _mm256_load_ps(tail[n][1] + 8 * p), a));
        }
      }
  }
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n)
      g.y[(t0 + m) * g.ldy + n0 + n] = reduce(_mm256_load_ps(park[0][m][n]), _mm256_load_ps(park[1][m][n]));
}

// Lines [from, to) of the weights into L2, `count` at most, from `from` on; returns where it stopped.
inline const char* prefetch_l2(const char* from, const char* to, std::int64_t count) {
  for (; from < to && count > 0; from += 64, --count) _mm_prefetch(from, _MM_HINT_T1);
  return from;
}

// Lines to prefetch after each of `tiles` feature tiles of every row tile but the first (of 3 rows, in
// [t0, t1)) so that [next, next_end) is all requested by the end of the chunk.
inline std::int64_t prefetch_slice(std::int64_t t0, std::int64_t t1, std::int64_t tiles, const char* next,
                                   const char* next_end) {
  const std::int64_t later = (t1 - t0 + 2) / 3 - 1, lines = (next_end - next) / 64;
  return later > 0 && tiles > 0 ? (lines + later * tiles - 1) / (later * tiles) : 0;
}

// One tile of M rows x N features: segmented (Seg: tile_seg) or both lane parts at once (tile_t).
template <DType Dt, bool Seg, int M, int N>
void run_tile(const GemmArgs& g, std::int64_t t, std::int64_t n) {
  if constexpr (Seg) tile_seg<Dt, M, N>(g, t, n);
  else tile_t<Dt, M, N>(g, t, n);
}

// Features [f0, f1) of rows [t0, t1): row tiles of 3 (the last 1 or 2) by 3 features (Seg) or 2 (the last
// 1 or 2 alone). [next, next_end): the weights of the chunk after this one, prefetched into L2 a slice after
// every tile of every row tile but the first (which waits on this chunk's own lines from memory): the later
// row tiles run from L2 while memory streams the next chunk.
template <DType Dt, bool Seg>
void sweep(const GemmArgs& g, std::int64_t t0, std::int64_t t1, std::int64_t f0, std::int64_t f1, const char* next,
           const char* next_end) {
  constexpr int N = Seg ? 3 : 2;
  const std::int64_t slice = prefetch_slice(t0, t1, (f1 - f0) / N, next, next_end);
  auto row_tile = [&]<int M>(std::int64_t t) {
    const std::int64_t lines = t == t0 ? 0 : slice;
    std::int64_t n = f0;
    for (; n + N <= f1; n += N) {
      run_tile<Dt, Seg, M, N>(g, t, n);
      next = prefetch_l2(next, next_end, lines);
    }
    if (f1 - n == 2) run_tile<Dt, Seg, M, 2>(g, t, n);
    else if (f1 - n == 1) run_tile<Dt, Seg, M, 1>(g, t, n);
  };
  std::int64_t t = t0;
  for (; t + 3 <= t1; t += 3) row_tile.template operator()<3>(t);
  if (t1 - t == 2) row_tile.template operator()<2>(t);
  else if (t1 - t == 1) row_tile.template operator()<1>(t);
}

// Blocking: rows in blocks of ~256 KiB of x (L2 holds it), and for each block the thread's features in
// chunks of ~96 KiB of weights (L2 too), each chunk swept by every row tile of the block: a weight is read
// from memory once per row block, and a row tile's x (3 rows) stays in L1 across its chunk. The previous
// loop (every row for each feature pair) read all of x from L3 for each pair: prefill 512 ran at ~25% of
// the FMA peak on the Zen 3 VM.
template <DType Dt>
void gemm_blocked(const GemmArgs& g, std::int64_t n0, std::int64_t n1, bool seg) {
  const std::int64_t row_bytes = g.kp * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t rows_per_block = std::max<std::int64_t>(3, (256 << 10) / row_bytes / 3 * 3);
  const std::int64_t feature_bytes = g.kp * static_cast<std::int64_t>(dtype_size(Dt));
  const std::int64_t chunk = std::max<std::int64_t>(6, (96 << 10) / feature_bytes / 6 * 6);  // 3 x 3 or 3 x 2
  for (std::int64_t r = 0; r < g.rows; r += rows_per_block) {
    const std::int64_t r1 = std::min(g.rows, r + rows_per_block);
    for (std::int64_t f = n0; f < n1; f += chunk) {
      const std::int64_t f1 = std::min(n1, f + chunk), f2 = std::min(n1, f1 + chunk);
      // The next chunk's bytes: from its first feature's panel (plain: row) to the end of its last one's.
      auto end_of = [&](std::int64_t f) {  // of features [0, f)
        return reinterpret_cast<const char*>(g.w) + (g.packed ? static_cast<std::size_t>((f + kPanel - 1) / kPanel) * g.panel_bytes
                                                              : static_cast<std::size_t>(f) * g.feature_bytes);
      };
      const char* a = reinterpret_cast<const char*>(g.w) + static_cast<std::size_t>(f1 / kPanel) * g.panel_bytes;
      const char* b = f2 > f1 ? end_of(f2) : a;
      if (seg) sweep<Dt, true>(g, r, r1, f, f1, a, b);
      else sweep<Dt, false>(g, r, r1, f, f1, a, b);
    }
  }
}

template <int N>
void rows_of(const GemmArgs& g, std::int64_t n0) {
  std::int64_t t = 0;
  for (; t + 2 <= g.rows; t += 2) tile<2, N>(g, t, n0);
  if (t < g.rows) tile<1, N>(g, t, n0);
}

}  // namespace

void set_avx2_gemm(int mode) { g_gemm_mode.store(std::clamp(mode, 0, 2), std::memory_order_relaxed); }

void set_avx2_gemv(int ahead_blocks) { g_gemv_ahead.store(std::max(-1, ahead_blocks), std::memory_order_relaxed); }

int avx2_gemv() { return gemv_ahead(); }

void gemm_avx2(const GemmArgs& g, std::int64_t n0, std::int64_t n1) {
  if (g.rows == 1 && g.packed) {
    if (const int a = gemv_ahead(); a >= 0) {
      const std::size_t ahead = static_cast<std::size_t>(a) * g.block_step;
      switch (g.dtype) {
        case DType::bf16: return gemv_packed<DType::bf16>(g, n0, n1, ahead);
        case DType::f16: return gemv_packed<DType::f16>(g, n0, n1, ahead);
        case DType::f32: return gemv_packed<DType::f32>(g, n0, n1, ahead);
      }
    }
  }
  if (const int mode = gemm_mode(); g.rows > 1 && mode > 0) {
    const bool seg = mode == 2 && g.rows >= kSegRows;
    switch (g.dtype) {
      case DType::bf16: return gemm_blocked<DType::bf16>(g, n0, n1, seg);
      case DType::f16: return gemm_blocked<DType::f16>(g, n0, n1, seg);
      case DType::f32: return gemm_blocked<DType::f32>(g, n0, n1, seg);
    }
  }
  std::int64_t n = n0;
  for (; n + 2 <= n1; n += 2) rows_of<2>(g, n);
  if (n < n1) rows_of<1>(g, n);
}

}  // namespace kvfleet::cpu::detail
