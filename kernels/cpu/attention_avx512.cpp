// paged_attention's block steps for AVX-512 F (this file alone is built with AVX-512 flags,
// kernels/CMakeLists.txt; paged_attention.cpp calls it only where cpu_isa() is avx512 or avx512bf16).
// The bits are those of paged_attention.cpp's plain steps; what differs is the register blocking:
// - scores: up to kPack queries (consecutive in the tile: rows x the GQA group's heads) at once, so each
//   transposed K row (the 16 keys of one dimension, one zmm) is loaded once for all of them: 4 x kPack
//   accumulators (the 4 partial sums over dims i mod 4 of each query), one FMA per query per K load with
//   the query's element broadcast from memory;
// - V: the same queries' accumulators for 64 columns (kPack x 4 zmm) share each V row load;
// - the block's max, exp and the rescale on 16 lanes; the sum of the weights stays in slot order;
// - K transposed by 16 x 16 in-register transposes (16 loads, 64 shuffles, 16 stores) instead of scalar
//   stores.
// The multiply-adds that GCC fuses in paged_attention.cpp (its default -ffp-contract=fast in C++; checked
// in its assembly) are explicit FMAs here, the others separate multiplies and adds.
// This file calls no inline function of a shared header (no std::vector, std::min, kv_elem.h): such a
// function compiled here could be the copy the linker keeps for every caller, which would then need AVX-512.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/cpu/attention_kernels.h"

namespace kvfleet::cpu::detail {
namespace {

constexpr std::int64_t kKeys = kAttnKeys;
constexpr int kPack = 6;  // queries per K/V load: 4 x 6 score accumulators, 6 x 4 V accumulators (+ 5 of 32)
constexpr int kCols = 4;  // zmm of V columns per pass: 64 floats

inline std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
inline __mmask16 first_lanes(std::int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : n <= 0 ? static_cast<__mmask16>(0)
                                                            : static_cast<__mmask16>((1u << n) - 1);
}

// paged_attention.cpp's exp_nonpositive on 16 lanes: the same operations in the same order; its fused
// multiply-adds (x * log2e + 0.5, x - n * c1, r + n * c2, the Horner steps, (p * r) * r + r) as FMAs.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_mask_blend_ps(tiny, x, lo);
  const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
  __m512 n = _mm512_cvtepi32_ps(_mm512_cvttps_epi32(t));
  n = _mm512_mask_add_ps(n, _mm512_cmp_ps_mask(t, n, _CMP_LT_OQ), n, _mm512_set1_ps(-1.0f));  // floor
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~tiny), p, _mm512_castsi512_ps(e));
}

// r[j] = row j (16 floats) -> r[i] = column i, in place: unpack ps, unpack pd, two 128-bit shuffles.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + c], 128-bit lane L: rows i .. i + 3 of column 4L + c
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int c = 0; c < 4; ++c) {  // column 4L + c = lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512 s0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), s1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
    const __m512 s2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 s3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_shuffle_f32x4(s0, s2, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(s0, s2, 0xdd);
    t[4 + c] = _mm512_shuffle_f32x4(s1, s3, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(s1, s3, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Unscaled scores of P queries against one group of 16 transposed keys: out[p] lane j = q_p . k_j as
// paged_attention.cpp's scores16 computes it (partial sum u over dims i = u mod 4 in increasing i, each
// step an FMA, then (s0 + s1) + (s2 + s3)); one load of each K row for all P queries.
template <int P>
inline void scores_pack(const float* const* q, const float* kt, std::int64_t d, __m512* out) {
  __m512 s[P][4];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p)
    for (int u = 0; u < 4; ++u) s[p][u] = _mm512_setzero_ps();
  std::int64_t i = 0;
  for (; i + 4 <= d; i += 4) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m512 k = _mm512_loadu_ps(kt + (i + u) * kKeys);
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) s[p][u] = _mm512_fmadd_ps(_mm512_set1_ps(q[p][i + u]), k, s[p][u]);
    }
  }
  for (int u = 0; i + u < d; ++u) {
    const __m512 k = _mm512_loadu_ps(kt + (i + u) * kKeys);
    for (int p = 0; p < P; ++p) s[p][u] = _mm512_fmadd_ps(_mm512_set1_ps(q[p][i + u]), k, s[p][u]);
  }
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p)
    out[p] = _mm512_add_ps(_mm512_add_ps(s[p][0], s[p][1]), _mm512_add_ps(s[p][2], s[p][3]));
}

// The online-softmax step of P queries over slots [0, n_p) of a block whose scaled scores are in w_p
// (groups of 16): each block max, the new running max, alpha = exp(m_old - m_new) (one 16-lane exp for all
// P), the weights exp(x - m_new) into w_p, their sums in slot order (the P chains interleaved), and
// l = l * alpha + sum (fused, as paged_attention.cpp's score_block).
template <int P>
inline void softmax_pack(AttnQuery* const* qs, float* const* w, const std::int64_t* n, float* alpha) {
  alignas(64) float shift[16] = {};
  float m_new[P];
  for (int p = 0; p < P; ++p) {
    __m512 mx = _mm512_set1_ps(-__builtin_inff());
    for (std::int64_t g = 0; g * kKeys < n[p]; ++g)  // max(x, mx): a NaN score is skipped, as by std::max
      mx = _mm512_mask_max_ps(mx, first_lanes(n[p] - g * kKeys), _mm512_loadu_ps(w[p] + g * kKeys), mx);
    const float mb = _mm512_reduce_max_ps(mx), m = qs[p]->m;
    m_new[p] = m < mb ? mb : m;
    shift[p] = m - m_new[p];
  }
  _mm512_storeu_ps(shift, exp_nonpositive(_mm512_load_ps(shift)));
  std::int64_t n_min = n[0];
  for (int p = 0; p < P; ++p) {
    alpha[p] = shift[p];
    n_min = min64(n_min, n[p]);
    const __m512 mv = _mm512_set1_ps(m_new[p]);
    for (std::int64_t g = 0; g * kKeys < n[p]; ++g)
      _mm512_storeu_ps(w[p] + g * kKeys, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(w[p] + g * kKeys), mv)));
  }
  float sum[P];
  for (int p = 0; p < P; ++p) sum[p] = 0.0f;
  for (std::int64_t j = 0; j < n_min; ++j)
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) sum[p] += w[p][j];
  for (int p = 0; p < P; ++p) {
    for (std::int64_t j = n_min; j < n[p]; ++j) sum[p] += w[p][j];
    qs[p]->l = __builtin_fmaf(qs[p]->l, alpha[p], sum[p]);
    qs[p]->m = m_new[p];
  }
}

// acc_p[c0, c0 + 64) = acc_p * alpha_p + sum over slots j < n_p of w_p[j] * v[j] (one FMA per slot, in
// slot order: accumulate_block's arithmetic per element), for P queries: the slots all of them reach
// share each V row load, the rest (a causal block's diagonal) go query by query.
template <int P>
inline void accumulate_pack(AttnQuery* const* qs, float* const* w, const float* alpha, const std::int64_t* n,
                            const float* v, std::int64_t d, std::int64_t c0) {
  __mmask16 m[kCols];
  for (int c = 0; c < kCols; ++c) m[c] = first_lanes(d - c0 - 16 * c);
  __m512 a[P][kCols];
  std::int64_t n_min = n[0];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) {
    n_min = min64(n_min, n[p]);
    const __m512 al = _mm512_set1_ps(alpha[p]);
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c)
      a[p][c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m[c], qs[p]->acc + c0 + 16 * c), al);
  }
  for (std::int64_t j = 0; j < n_min; ++j) {
    __m512 x[kCols];
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) x[c] = _mm512_maskz_loadu_ps(m[c], v + j * d + c0 + 16 * c);
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      const __m512 b = _mm512_set1_ps(w[p][j]);
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) a[p][c] = _mm512_fmadd_ps(b, x[c], a[p][c]);
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) {
    for (std::int64_t j = n_min; j < n[p]; ++j) {
      const __m512 b = _mm512_set1_ps(w[p][j]);
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c)
        a[p][c] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m[c], v + j * d + c0 + 16 * c), a[p][c]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) _mm512_mask_storeu_ps(qs[p]->acc + c0 + 16 * c, m[c], a[p][c]);
  }
}

// P queries (each reaching slots [0, n_p) of the block, n_p >= 1) through one block; w: P x wstride floats.
template <int P>
void attend_pack(AttnQuery* const* qs, const std::int64_t* n, const float* kt, const float* v, std::int64_t d,
                 float scale, float* w, std::int64_t wstride) {
  const float* q[P];
  float* wp[P];
  float alpha[P];
  std::int64_t n_max = 0;
  for (int p = 0; p < P; ++p) {
    q[p] = qs[p]->q;
    wp[p] = w + p * wstride;
    n_max = n[p] > n_max ? n[p] : n_max;
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (std::int64_t g = 0; g * kKeys < n_max; ++g) {
    __m512 s[P];
    scores_pack<P>(q, kt + g * d * kKeys, d, s);
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(wp[p] + g * kKeys, _mm512_mul_ps(s[p], sc));
  }
  softmax_pack<P>(qs, wp, n, alpha);
  for (std::int64_t c0 = 0; c0 < d; c0 += 16 * kCols) accumulate_pack<P>(qs, wp, alpha, n, v, d, c0);
}

void attend_pack(int count, AttnQuery* const* qs, const std::int64_t* n, const float* kt, const float* v,
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

}  // namespace

void transpose_keys_avx512(const float* k, std::int64_t n, std::int64_t d, float* kt) {
  for (std::int64_t g = 0; g * kKeys < n; ++g) {
    const std::int64_t keys = min64(kKeys, n - g * kKeys);
    float* dst = kt + g * d * kKeys;
    for (std::int64_t i0 = 0; i0 < d; i0 += 16) {
      const std::int64_t dims = min64(16, d - i0);
      const __mmask16 m = first_lanes(dims);
      __m512 r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = j < keys ? _mm512_maskz_loadu_ps(m, k + (g * kKeys + j) * d + i0) : _mm512_setzero_ps();
      transpose16(r);
      for (std::int64_t i = 0; i < dims; ++i) _mm512_storeu_ps(dst + (i0 + i) * kKeys, r[i]);
    }
  }
}

void attend_block_avx512(AttnQuery* qs, std::int64_t nq, std::int64_t start, std::int64_t block_size,
                         const float* kt, const float* v, std::int64_t d, float scale, float* w) {
  const std::int64_t wstride = (block_size + kKeys - 1) / kKeys * kKeys;
  AttnQuery* pack[kPack];
  std::int64_t n[kPack];
  int count = 0;
  for (std::int64_t i = 0; i < nq; ++i) {
    if (qs[i].position < start) continue;
    pack[count] = &qs[i];
    n[count] = min64(block_size, qs[i].position - start + 1);
    if (++count == kPack) {
      attend_pack(count, pack, n, kt, v, d, scale, w, wstride);
      count = 0;
    }
  }
  if (count > 0) attend_pack(count, pack, n, kt, v, d, scale, w, wstride);
}

}  // namespace kvfleet::cpu::detail
