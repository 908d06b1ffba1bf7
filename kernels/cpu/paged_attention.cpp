// Paged attention on the CPU: flash-style, one work item per (tile of query rows, kv head), the heaviest
// tiles first (make_tiles).
//
// A tile is up to kTileRows consecutive rows of one sequence (a prefill chunk; a decode row is a tile of
// one). For every K/V block the tile's rows reach, the block is widened to fp32 once (K transposed, so that
// 16 keys' scores are one vector: scores16) and used by all the tile's rows and all the query heads of the
// kv head's GQA group. Where the cache keeps K transposed beside it (KvLayer::kt: the CPU backend does),
// that copy is read and nothing is transposed per step (decode transposed every block on every step: ~40%
// of its attention time); a block whose copy is stale is transposed again first (refresh_transposed). The
// next block is prefetched while one is read (g_prefetch_blocks). Softmax is online: per block, the running
// max m, the running sum l and the accumulator are rescaled by exp(m_old - m_new). The blocks are visited
// in absolute key order and each query's arithmetic depends only on its own position and the cache, so a
// row gives the same bits in a tile of any size, in any batch, chunked or not, on any number of threads.
//
// The arithmetic of each query, which every instruction set's kernel keeps exactly (attention_kernels.h;
// AVX-512: attention_avx512.cpp and AVX2: attend_block_avx2 below, chosen by cpu_isa(); scalar: the plain
// steps below, compiled for the build's -march): scores as 4 partial sums over dims i mod 4 of fused multiply-adds, (s0 + s1) + (s2 + s3),
// times scale; the block's max; the polynomial exp of x - m (and of m_old - m for the rescale); the
// weights summed in slot order; l = fma(l, alpha, sum); acc = acc * alpha, then one fused multiply-add per
// slot in slot order; out = acc * (1 / l). (GCC fuses a * b + c by default in C++, -ffp-contract=fast:
// the AVX2 and AVX-512 kernels write the same FMAs explicitly; tests/model/test_attention.cpp compares the
// paths bit for bit.)
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/kv_elem.h"
#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

constexpr std::int64_t kTileRows = 16;

// The scores are computed 16 keys at a time against K transposed ([dim][16 keys], zero-padded past the
// block's last key), so that the 16 keys are the vector lanes and no horizontal sum is needed: key j's
// q . k is four partial sums over the dimensions i = u (mod 4), each in increasing i, then (s0 + s1) +
// (s2 + s3). That order is a function of head_dim alone, whatever the tile, the batch or the block.
constexpr int kKeys = static_cast<int>(detail::kAttnKeys);
static_assert(KvLayer::kKtKeys == detail::kAttnKeys, "K's transposed copy is read as the kernels' groups");

// GCC/Clang vector types (AVX2 registers with the build's -march; element-wise, so the arithmetic is the
// plain loop's): the 4 partial sums of 16 keys stay in 8 registers.
typedef float V8 __attribute__((vector_size(32)));  // loaded and stored with memcpy (unaligned)

inline void scores16(const float* q, const float* kt, std::int64_t d, float* out) {
  V8 s[4][2] = {};
  for (std::int64_t i = 0; i < d; i += 4)
    for (int u = 0; u < 4 && i + u < d; ++u) {
      const float* row = kt + (i + u) * kKeys;
      V8 lo, hi;
      std::memcpy(&lo, row, sizeof lo);
      std::memcpy(&hi, row + 8, sizeof hi);
      s[u][0] += q[i + u] * lo;
      s[u][1] += q[i + u] * hi;
    }
  const V8 lo = (s[0][0] + s[1][0]) + (s[2][0] + s[3][0]), hi = (s[0][1] + s[1][1]) + (s[2][1] + s[3][1]);
  std::memcpy(out, &lo, sizeof lo);
  std::memcpy(out + 8, &hi, sizeof hi);
}

// Keys [0, n) of a block (rows of d floats) into groups of 16 transposed keys, zero-padded to whole groups.
inline void transpose_keys(const float* k, std::int64_t n, std::int64_t d, float* kt) {
  const std::int64_t groups = (n + kKeys - 1) / kKeys;
  for (std::int64_t g = 0; g < groups; ++g) {
    float* dst = kt + g * d * kKeys;
    const std::int64_t keys = std::min<std::int64_t>(kKeys, n - g * kKeys);
    for (std::int64_t j = 0; j < keys; ++j) {
      const float* src = k + (g * kKeys + j) * d;
      for (std::int64_t i = 0; i < d; ++i) dst[i * kKeys + j] = src[i];
    }
    for (std::int64_t j = keys; j < kKeys; ++j)
      for (std::int64_t i = 0; i < d; ++i) dst[i * kKeys + j] = 0.0f;
  }
}

// e^x for x <= 0 (scores minus their running max), Cephes' expf polynomial (within 2 ulp of expf): plain
// arithmetic, so that the loop over a block's scores vectorizes where calls to expf would not. Below -87
// (under 1e-38 of the largest weight) it returns 0, and exp(-inf) of the first block's rescale is 0.
inline float exp_nonpositive(float x) {
  const bool tiny = x < -87.0f;
  x = tiny ? -87.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const auto scale = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  return tiny ? 0.0f : p * scale;
}

// exp_nonpositive on 8 lanes: exp_poly.h (the same operations, floor as truncation corrected downwards), so
// that a block's weights are computed 8 at a time.
inline V8 exp_nonpositive(V8 x) { return detail::exp_poly8(x); }

using QueryState = detail::AttnQuery;

struct Scratch {
  std::vector<float> k, kt, v, p, alpha, acc;
  std::vector<QueryState> qs;
};

// A block's K or V of one kv head, slots [0, n), as fp32: in place for an fp32 cache, widened otherwise.
template <class T>
const float* block_rows(const KvLayer& c, std::int64_t offset, std::int64_t n, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    (void)n;
    (void)buf;
    return c.at<float>(offset);
  } else {
    widen(c.at<T>(offset), buf.data(), n * c.head_dim);
    return buf.data();
  }
}

// Scores of one query against slots [0, n) of a block (kt: its keys transposed, transpose_keys); updates m
// and l and leaves the block's weights in p (room for the block rounded up to 16) and the rescale of the
// old accumulator in alpha.
inline void score_block(QueryState& s, const float* kt, std::int64_t n, std::int64_t d, float scale, float* p,
                        float& alpha) {
  for (std::int64_t g = 0; g * kKeys < n; ++g) scores16(s.q, kt + g * d * kKeys, d, p + g * kKeys);
  float mb = -INFINITY;
  for (std::int64_t j = 0; j < n; ++j) mb = std::max(mb, p[j] = p[j] * scale);
  const float m_new = std::max(s.m, mb);
  alpha = exp_nonpositive(s.m - m_new);  // 0 on the first block (m = -inf): acc and l are 0 anyway
  for (std::int64_t j = 0; j < n; j += 8) {  // whole groups of 8 (p has room): lanes past n are not used
    V8 x;
    std::memcpy(&x, p + j, sizeof x);
    x = exp_nonpositive(x - m_new);
    std::memcpy(p + j, &x, sizeof x);
  }
  float sum = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) sum += p[j];
  s.l = std::fma(s.l, alpha, sum);  // what the compiler fused before; explicit so that every compiler does
  s.m = m_new;
}

// acc = acc * alpha + sum_j p[j] * v[j], element by element in slot order; 64 (then 8) elements at a time
// held in registers across the block's slots (the order per element is the same as a plain loop's).
// W x 8 elements of acc, held in W registers across the block's slots: W independent multiply-add chains.
template <int W>
inline void accumulate_lanes(float* acc, const float* v, std::int64_t n, std::int64_t d, const float* p, float alpha) {
  V8 a[W];
  for (int w = 0; w < W; ++w) {
    std::memcpy(&a[w], acc + 8 * w, sizeof(V8));
    a[w] *= alpha;
  }
  for (std::int64_t j = 0; j < n; ++j) {
    const float* row = v + j * d;
#pragma GCC unroll 8
    for (int w = 0; w < W; ++w) {
      V8 x;
      std::memcpy(&x, row + 8 * w, sizeof x);
      a[w] += p[j] * x;
    }
  }
  for (int w = 0; w < W; ++w) std::memcpy(acc + 8 * w, &a[w], sizeof(V8));
}

inline void accumulate_block(QueryState& s, const float* v, std::int64_t n, std::int64_t d, const float* p,
                             float alpha) {
  std::int64_t i = 0;
  for (; i + 64 <= d; i += 64) accumulate_lanes<8>(s.acc + i, v + i, n, d, p, alpha);
  for (; i + 8 <= d; i += 8) accumulate_lanes<1>(s.acc + i, v + i, n, d, p, alpha);
  // The last d mod 8 elements: the explicit fma is the vector lanes' arithmetic (left to the compiler, GCC 12
  // vectorized this loop over 4 slots at a time with separate multiplies and adds, fusing only the rest).
  for (; i < d; ++i) {
    float a = s.acc[i] * alpha;
    for (std::int64_t j = 0; j < n; ++j) a = std::fma(p[j], v[j * d + i], a);
    s.acc[i] = a;
  }
}

// One block into every query of qs[0, nq) that reaches it (position >= start): the plain steps (cpu_isa()
// scalar), query by query (attend_block_avx2 below and attention_kernels.h's attend_block_avx512 do the same
// for several at once).
// alpha: room for nq floats.
void attend_block(QueryState* qs, std::int64_t nq, std::int64_t start, std::int64_t bs, const float* kt,
                  const float* v, std::int64_t d, float scale, float* p, float* alpha) {
  const std::int64_t bsp = (bs + kKeys - 1) / kKeys * kKeys;
  for (std::int64_t i = 0; i < nq; ++i) {
    if (qs[i].position < start) continue;
    score_block(qs[i], kt, std::min(bs, qs[i].position - start + 1), d, scale, p + i * bsp, alpha[i]);
  }
  for (std::int64_t i = 0; i < nq; ++i) {
    if (qs[i].position < start) continue;
    accumulate_block(qs[i], v, std::min(bs, qs[i].position - start + 1), d, p + i * bsp, alpha[i]);
  }
}

// The AVX2 kernel (cpu_isa() avx2): attend_block's arithmetic with the register blocking of
// attention_avx512.cpp, for AVX2's 16 registers. Every instruction is the one GCC emits for the steps above
// (their multiply-adds fused), so the bits are theirs; the scalar path (cpu_isa() scalar) keeps the steps
// query by query and tests/model/test_attention.cpp compares the two bit for bit.
// - Scores of up to kPack2 queries at once, one partial sum u (dims i = u mod 4) at a time: 2 accumulators
//   (16 keys) per query, 12 of the 16 registers, each transposed K row loaded once for all of them (the
//   steps: a K row and a broadcast of q for every 2 FMAs of every query).
// - V: 3 queries x 32 columns (12 accumulators) share each V row load (the steps: 8 loads for 8 FMAs).
// - The softmax step of the same queries together (softmax_pack): their sums' dependent adds interleaved.
constexpr int kPack2 = 6;

template <int P>
inline void scores_pack(const QueryState* const* qs, const float* kt, std::int64_t d, float scale, float* const* out) {
  __m256 part[4][P][2];
  for (int u = 0; u < 4; ++u) {
    __m256 s[P][2];
    for (int p = 0; p < P; ++p) s[p][0] = s[p][1] = _mm256_setzero_ps();
    for (std::int64_t i = u; i < d; i += 4) {
      const __m256 lo = _mm256_loadu_ps(kt + i * kKeys), hi = _mm256_loadu_ps(kt + i * kKeys + 8);
      for (int p = 0; p < P; ++p) {
        const __m256 b = _mm256_broadcast_ss(qs[p]->q + i);
        s[p][0] = _mm256_fmadd_ps(b, lo, s[p][0]);
        s[p][1] = _mm256_fmadd_ps(b, hi, s[p][1]);
      }
    }
    for (int p = 0; p < P; ++p) part[u][p][0] = s[p][0], part[u][p][1] = s[p][1];
  }
  const __m256 sc = _mm256_set1_ps(scale);
  for (int p = 0; p < P; ++p)
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(out[p] + 8 * h, _mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(part[0][p][h], part[1][p][h]),
                                                                   _mm256_add_ps(part[2][p][h], part[3][p][h])),
                                                     sc));
}

// score_block's softmax for P queries whose scaled scores are in w[p], slots [0, n_p): the same operations, with
// the block's max taken 8 lanes at a time (max(x, m) keeps m for a NaN x and for a tie, as std::max(m, x)
// does; the zero a tie of -0 and +0 leaves changes no weight), the P alphas in one exp, and the sums in slot
// order with the P chains interleaved (the plain steps: one query's 16 dependent adds after another's).
template <int P>
inline void softmax_pack(QueryState* const* qs, float* const* w, const std::int64_t* n, float* alpha) {
  alignas(32) float shift[8] = {};
  float m_new[P];
  for (int p = 0; p < P; ++p) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    std::int64_t j = 0;
    for (; j + 8 <= n[p]; j += 8) mx = _mm256_max_ps(_mm256_loadu_ps(w[p] + j), mx);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float mb = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
    for (; j < n[p]; ++j) mb = std::max(mb, w[p][j]);
    m_new[p] = std::max(qs[p]->m, mb);
    shift[p] = qs[p]->m - m_new[p];
  }
  V8 e;
  std::memcpy(&e, shift, sizeof e);
  e = exp_nonpositive(e);
  std::memcpy(shift, &e, sizeof e);
  std::int64_t n_min = n[0];
  for (int p = 0; p < P; ++p) {
    n_min = std::min(n_min, n[p]);
    const __m256 m = _mm256_set1_ps(m_new[p]);
    for (std::int64_t j = 0; j < n[p]; j += 8) {  // whole groups of 8 (w has room): lanes past n_p not used
      V8 x;
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(w[p] + j), m);
      std::memcpy(&x, &d, sizeof x);
      x = exp_nonpositive(x);
      std::memcpy(w[p] + j, &x, sizeof x);
    }
  }
  float sum[P];
  for (int p = 0; p < P; ++p) sum[p] = 0.0f;
  for (std::int64_t j = 0; j < n_min; ++j)
    for (int p = 0; p < P; ++p) sum[p] += w[p][j];
  for (int p = 0; p < P; ++p) {
    for (std::int64_t j = n_min; j < n[p]; ++j) sum[p] += w[p][j];
    alpha[p] = shift[p];
    qs[p]->l = std::fma(qs[p]->l, alpha[p], sum[p]);
    qs[p]->m = m_new[p];
  }
}

// acc[c0, c0 + 8 C) of P queries: acc * alpha, then one FMA per slot in slot order (accumulate_lanes'
// arithmetic); the slots all P reach share each V row load, the rest (a causal block's diagonal) go query
// by query.
template <int P, int C>
inline void accumulate_pack(QueryState* const* qs, float* const* w, const float* alpha, const std::int64_t* n,
                            const float* v, std::int64_t d, std::int64_t c0) {
  __m256 a[P][C];
  std::int64_t n_min = n[0];
  for (int p = 0; p < P; ++p) {
    n_min = std::min(n_min, n[p]);
    const __m256 al = _mm256_set1_ps(alpha[p]);
    for (int c = 0; c < C; ++c) a[p][c] = _mm256_mul_ps(_mm256_loadu_ps(qs[p]->acc + c0 + 8 * c), al);
  }
  for (std::int64_t j = 0; j < n_min; ++j) {
    __m256 x[C];
    for (int c = 0; c < C; ++c) x[c] = _mm256_loadu_ps(v + j * d + c0 + 8 * c);
    for (int p = 0; p < P; ++p) {
      const __m256 b = _mm256_broadcast_ss(w[p] + j);
      for (int c = 0; c < C; ++c) a[p][c] = _mm256_fmadd_ps(b, x[c], a[p][c]);
    }
  }
  for (int p = 0; p < P; ++p) {
    for (std::int64_t j = n_min; j < n[p]; ++j) {
      const __m256 b = _mm256_broadcast_ss(w[p] + j);
      for (int c = 0; c < C; ++c) a[p][c] = _mm256_fmadd_ps(b, _mm256_loadu_ps(v + j * d + c0 + 8 * c), a[p][c]);
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(qs[p]->acc + c0 + 8 * c, a[p][c]);
  }
}

template <int P>
void accumulate_packs(QueryState* const* qs, float* const* w, const float* alpha, const std::int64_t* n,
                      const float* v, std::int64_t d) {
  std::int64_t c0 = 0;
  for (; c0 + 32 <= d; c0 += 32) accumulate_pack<P, 4>(qs, w, alpha, n, v, d, c0);
  for (; c0 + 8 <= d; c0 += 8) accumulate_pack<P, 1>(qs, w, alpha, n, v, d, c0);
  for (int p = 0; p < P && c0 < d; ++p)  // the last d mod 8 elements, as accumulate_block's
    for (std::int64_t i = c0; i < d; ++i) {
      float a = qs[p]->acc[i] * alpha[p];
      for (std::int64_t j = 0; j < n[p]; ++j) a = std::fma(w[p][j], v[j * d + i], a);
      qs[p]->acc[i] = a;
    }
}

// P queries (each reaching slots [0, n_p) of the block) through one block; w: P x wstride floats.
template <int P>
void attend_pack(QueryState* const* qs, const std::int64_t* n, const float* kt, const float* v, std::int64_t d,
                 float scale, float* w, std::int64_t wstride) {
  float* wp[P];
  float alpha[P];
  std::int64_t n_max = 0;
  for (int p = 0; p < P; ++p) {
    wp[p] = w + p * wstride;
    n_max = std::max(n_max, n[p]);
  }
  for (std::int64_t g = 0; g * kKeys < n_max; ++g) {
    float* out[P];
    for (int p = 0; p < P; ++p) out[p] = wp[p] + g * kKeys;
    scores_pack<P>(qs, kt + g * d * kKeys, d, scale, out);
  }
  softmax_pack<P>(qs, wp, n, alpha);
  // V in packs of 3 (12 accumulators at 32 columns).
  int p = 0;
  for (; p + 3 <= P; p += 3) accumulate_packs<3>(qs + p, wp + p, alpha + p, n + p, v, d);
  if (P - p == 2) accumulate_packs<2>(qs + p, wp + p, alpha + p, n + p, v, d);
  else if (P - p == 1) accumulate_packs<1>(qs + p, wp + p, alpha + p, n + p, v, d);
}

void attend_pack(int count, QueryState* const* qs, const std::int64_t* n, const float* kt, const float* v,
                 std::int64_t d, float scale, float* w, std::int64_t wstride) {
  switch (count) {
    case 1: return attend_pack<1>(qs, n, kt, v, d, scale, w, wstride);
    case 2: return attend_pack<2>(qs, n, kt, v, d, scale, w, wstride);
    case 3: return attend_pack<3>(qs, n, kt, v, d, scale, w, wstride);
    case 4: return attend_pack<4>(qs, n, kt, v, d, scale, w, wstride);
    case 5: return attend_pack<5>(qs, n, kt, v, d, scale, w, wstride);
    default: return attend_pack<6>(qs, n, kt, v, d, scale, w, wstride);
  }
}

// attend_block on the AVX2 kernel: the queries that reach the block in packs of kPack2.
void attend_block_avx2(QueryState* qs, std::int64_t nq, std::int64_t start, std::int64_t bs, const float* kt,
                       const float* v, std::int64_t d, float scale, float* w) {
  const std::int64_t wstride = (bs + kKeys - 1) / kKeys * kKeys;
  QueryState* pack[kPack2];
  std::int64_t n[kPack2];
  int count = 0;
  for (std::int64_t i = 0; i < nq; ++i) {
    if (qs[i].position < start) continue;
    pack[count] = &qs[i];
    n[count] = std::min(bs, qs[i].position - start + 1);
    if (++count == kPack2) {
      attend_pack(count, pack, n, kt, v, d, scale, w, wstride);
      count = 0;
    }
  }
  if (count > 0) attend_pack(count, pack, n, kt, v, d, scale, w, wstride);
}

// How many blocks ahead of the one being read attend_tile prefetches (set_attention_prefetch_blocks: benchmarks
// compare in one process; KVFLEET_CPU_ATTN_PREFETCH=N, read once). A block's K and V of one kv head are two
// runs of block_size x head_dim elements (4 KiB each in fp32 at 16 x 64) 12 KiB apart in the next block 32
// KiB on (Contract 5's layout), and the blocks of a sequence lie anywhere: the hardware prefetchers do not
// follow, and without this each block began with a wait on memory (decode of 32 sequences x 512 keys read
// 5.7 GB/s on one thread where a block from L2 takes a third of the time; docs/cpu_backend.md).
std::atomic<std::int64_t> g_prefetch_blocks{[] {
  const char* env = std::getenv("KVFLEET_CPU_ATTN_PREFETCH");
  return env ? std::max<std::int64_t>(0, std::atoll(env)) : std::int64_t{1};
}()};

// One cache line into L1. An asm statement, not __builtin_prefetch: GCC 12 deleted a loop of nothing but
// prefetches here as free of side effects (none was left in the object code).
inline void prefetch_line(const char* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// What attention reads of slots [0, n) of one block and kv head, every cache line of it, into the caches:
// the transposed copy of K where the cache has one (whole groups of 16 keys), else K; and V.
template <class T>
inline void prefetch_block(const KvLayer& c, std::int32_t block, std::int64_t h, std::int64_t n) {
  const std::int64_t elem = static_cast<std::int64_t>(sizeof(T)), v_bytes = n * c.head_dim * elem;
  const auto* v = reinterpret_cast<const char*>(c.at<T>(c.v_offset(block, h, 0)));
  for (std::int64_t o = 0; o < v_bytes; o += 64) prefetch_line(v + o);
  const bool kt = c.kt != nullptr;
  const auto* k = reinterpret_cast<const char*>(kt ? c.kt_at<T>(c.kt_offset(block, h)) : c.at<T>(c.k_offset(block, h, 0)));
  const std::int64_t k_bytes = kt ? (n + kKeys - 1) / kKeys * kKeys * c.head_dim * elem : v_bytes;
  for (std::int64_t o = 0; o < k_bytes; o += 64) prefetch_line(k + o);
}

// The transposed keys of slots [0, n) of one block and kv head (KvLayer::kt, fresh): in place for an fp32
// cache, widened into buf otherwise (whole groups of 16; a lane past n holds whatever the slot holds, and no
// query reads a score past its own last key).
template <class T>
const float* transposed_rows(const KvLayer& c, std::int32_t block, std::int64_t h, std::int64_t n,
                             std::vector<float>& buf) {
  const T* kt = c.kt_at<T>(c.kt_offset(block, h));
  if constexpr (std::is_same_v<T, float>) {
    (void)n;
    (void)buf;
    return kt;
  } else {
    widen(kt, buf.data(), (n + kKeys - 1) / kKeys * kKeys * c.head_dim);
    return buf.data();
  }
}

// Which block steps attend_tile runs (all with the same bits): attend_block query by query (cpu_isa()
// scalar), attend_block_avx2 (avx2) or attention_avx512.cpp's (avx512, avx512bf16).
enum class Steps { plain, avx2, avx512 };

// Rows [r0, r0 + nr) of one sequence (consecutive positions), kv head h, all the heads of its group.
template <class T>
void attend_tile(const float* q, std::int64_t r0, std::int64_t nr, std::int64_t num_heads, std::int64_t h,
                 const AttnRow* rows, const KvLayer& c, float scale, float* out, Scratch& s, Steps steps) {
  const bool wide = steps == Steps::avx512;
  const std::int64_t d = c.head_dim, bs = c.block_size, group = num_heads / c.num_kv_heads;
  const std::int64_t nq = nr * group, bsp = (bs + kKeys - 1) / kKeys * kKeys;
  s.qs.resize(static_cast<std::size_t>(nq));
  s.acc.assign(static_cast<std::size_t>(nq * d), 0.0f);
  s.p.resize(static_cast<std::size_t>(nq * bsp));
  s.kt.resize(static_cast<std::size_t>(bsp * d));
  s.alpha.resize(static_cast<std::size_t>(nq));
  if constexpr (!std::is_same_v<T, float>) {
    s.k.resize(static_cast<std::size_t>(bs * d));
    s.v.resize(static_cast<std::size_t>(bs * d));
  }
  std::int32_t last = 0;
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::int64_t r = r0 + i / group, head = h * group + i % group;
    s.qs[static_cast<std::size_t>(i)] = {q + (r * num_heads + head) * d, s.acc.data() + i * d, rows[r].position,
                                         -INFINITY, 0.0f};
    last = std::max(last, rows[r].position);
  }
  const std::int32_t* table = rows[r0].block_table;
  const std::int64_t ahead = g_prefetch_blocks.load(std::memory_order_relaxed);
  auto prefetch = [&](std::int64_t b) { prefetch_block<T>(c, table[b], h, std::min(bs, last - b * bs + 1)); };
  for (std::int64_t b = 0; b < ahead && b * bs <= last; ++b) prefetch(b);
  for (std::int64_t b = 0; b * bs <= last; ++b) {
    const std::int64_t start = b * bs, n_block = std::min(bs, last - start + 1);
    if (ahead > 0 && (b + ahead) * bs <= last) prefetch(b + ahead);  // read while this block is
    const float* v = block_rows<T>(c, c.v_offset(table[b], h, 0), n_block, s.v);
    const float* kt = s.kt.data();
    if (c.kt) {
      kt = transposed_rows<T>(c, table[b], h, n_block, s.kt);
    } else {
      const float* k = block_rows<T>(c, c.k_offset(table[b], h, 0), n_block, s.k);
      if (wide) detail::transpose_keys_avx512(k, n_block, d, s.kt.data());
      else transpose_keys(k, n_block, d, s.kt.data());
    }
    if (wide) detail::attend_block_avx512(s.qs.data(), nq, start, bs, kt, v, d, scale, s.p.data());
    else if (steps == Steps::avx2) attend_block_avx2(s.qs.data(), nq, start, bs, kt, v, d, scale, s.p.data());
    else attend_block(s.qs.data(), nq, start, bs, kt, v, d, scale, s.p.data(), s.alpha.data());
  }
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::int64_t r = r0 + i / group, head = h * group + i % group;
    const QueryState& qs = s.qs[static_cast<std::size_t>(i)];
    float* o = out + (r * num_heads + head) * d;
    const float inv = 1.0f / qs.l;
    for (std::int64_t x = 0; x < d; ++x) o[x] = qs.acc[x] * inv;
  }
}

struct Tile {
  std::int64_t begin, rows;
  std::int64_t work;  // query-key pairs of one of its kv heads, about: rows x (last position + 1)
};

// Consecutive rows of one sequence at consecutive positions, at most kTileRows each, into `tiles`
// (the caller's reused buffer: no allocation per call once it has grown), heaviest first (most query-key
// pairs; ties in row order). A causal prefill's tiles grow with their position: in row order the heaviest
// came last, in the last of the pool's equal chunks, and one thread ran them while the other waited
// (at two threads this order runs a 512-token prefill's attention 1.19x and a 4096-token one's 1.11x as
// fast as row order did; docs/cpu_backend.md).
// Heaviest first with chunks that shrink towards the end (parallel_for_tapered) leaves the light ones for
// last. Which thread runs a tile, and when, changes no bit of it.
void make_tiles(const AttnRow* rows, std::int64_t n, std::vector<Tile>& tiles) {
  tiles.clear();
  for (std::int64_t r = 0; r < n; ++r) {
    if (!tiles.empty()) {
      Tile& t = tiles.back();
      const AttnRow& prev = rows[t.begin + t.rows - 1];
      if (t.rows < kTileRows && rows[r].block_table == prev.block_table && rows[r].position == prev.position + 1) {
        ++t.rows;
        continue;
      }
    }
    tiles.push_back({r, 1, 0});
  }
  for (Tile& t : tiles) t.work = t.rows * (rows[t.begin + t.rows - 1].position + 1);
  std::sort(tiles.begin(), tiles.end(),
            [](const Tile& a, const Tile& b) { return a.work != b.work ? a.work > b.work : a.begin < b.begin; });
}

// Every block the tiles read whose transposed copy is not fresh (KvLayer::kt_fresh: K was written behind
// it), transposed again from K for every kv head, padding lanes zero. On the caller, before the items run:
// two tiles can share a block (a cached prefix), so no item may write it.
template <class T>
void refresh_transposed(const KvLayer& c, const AttnRow* rows, const std::vector<Tile>& tiles) {
  const std::int64_t bs = c.block_size, d = c.head_dim, bsp = (bs + kKeys - 1) / kKeys * kKeys;
  for (const Tile& t : tiles) {
    const AttnRow& r = rows[t.begin + t.rows - 1];  // the tile's last (highest) position
    for (std::int64_t b = 0; b * bs <= r.position; ++b) {
      const std::int32_t block = r.block_table[b];
      if (c.kt_fresh[block]) continue;
      for (std::int64_t h = 0; h < c.num_kv_heads; ++h) {
        const T* k = c.at<T>(c.k_offset(block, h, 0));
        T* kt = c.kt_at<T>(c.kt_offset(block, h));
        for (std::int64_t j = 0; j < bsp; ++j)
          for (std::int64_t i = 0; i < d; ++i)
            kt[c.kt_slot_offset(j, i)] = j < bs ? k[j * d + i] : T{};
      }
      c.kt_fresh[block] = 1;
    }
  }
}

}  // namespace

void detail::set_attention_prefetch_blocks(std::int64_t blocks) {
  g_prefetch_blocks.store(std::max<std::int64_t>(0, blocks), std::memory_order_relaxed);
}

void paged_attention(ThreadPool& pool, const float* q, std::int64_t rows, std::int64_t num_heads,
                     const AttnRow* row_info, KvLayer cache, float scale, float* out) {
  thread_local std::vector<Tile> caller_tiles;
  std::vector<Tile>& tiles = caller_tiles;  // a reference: the workers must read the caller's tiles, not theirs
  make_tiles(row_info, rows, tiles);
  const std::int64_t kvh = cache.num_kv_heads, items = static_cast<std::int64_t>(tiles.size()) * kvh;
  const Isa isa = cpu_isa();
  const Steps steps = isa == Isa::avx512 || isa == Isa::avx512bf16 ? Steps::avx512
                      : isa == Isa::avx2                        ? Steps::avx2
                                                                : Steps::plain;
  with_kv_type(cache.dtype, [&](auto elem) {
    using T = decltype(elem);
    if (cache.kt) refresh_transposed<T>(cache, row_info, tiles);
    pool.parallel_for_tapered(items, 1, 1, [&](std::int64_t begin, std::int64_t end) {
      thread_local Scratch scratch;
      const bool ahead = g_prefetch_blocks.load(std::memory_order_relaxed) > 0;
      for (std::int64_t i = begin; i < end; ++i) {
        if (ahead && i + 1 < end) {  // the next item's first block, read while this item's are
          const Tile& n = tiles[static_cast<std::size_t>((i + 1) / kvh)];
          const AttnRow& r = row_info[n.begin + n.rows - 1];
          prefetch_block<T>(cache, r.block_table[0], (i + 1) % kvh,
                            std::min<std::int64_t>(cache.block_size, r.position + 1));
        }
        const Tile& t = tiles[static_cast<std::size_t>(i / kvh)];
        attend_tile<T>(q, t.begin, t.rows, num_heads, i % kvh, row_info, cache, scale, out, scratch, steps);
      }
    });
  });
}

}  // namespace kvfleet::cpu
