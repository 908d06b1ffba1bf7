// The fixed lane tree of linear_kernels.h on AVX-512 registers, for the AVX-512 kernel files only (their
// file-wide flags allow the instructions). Internal linkage (an anonymous namespace): every including file
// keeps its own copy, so the linker can never hand an AVX-512 copy of these to code built without it.
#pragma once

#include <immintrin.h>

namespace kvfleet::cpu::detail {
namespace {

inline float reduce(__m512 v) {
  const __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
  const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
  return _mm_cvtss_f32(_mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1)));
}

// Four accumulators to four outputs (y[0..3]) with exactly reduce()'s tree for each: every step adds the
// same pair of lanes as reduce() does, but for four accumulators at once (the 128-bit quarters of one
// register), so the epilogue of a 6 x 4 tile is ~14 instructions a row instead of ~32; at K = 768 the
// per-tile reductions were ~15% of the tile's vector instructions.
inline void reduce4(__m512 a, __m512 b, __m512 c, __m512 d, float* y) {
  // l[i] + l[i + 8]: quarters (0 + 2, 1 + 3) of a then b, of c then d.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
  // + [i + 4]: one quarter per accumulator, in the order a, b, c, d.
  const __m512 s4 = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
  const __m512 s2 = _mm512_add_ps(s4, _mm512_permute_ps(s4, 0x4e));  // + [i + 2]
  const __m512 s1 = _mm512_add_ps(s2, _mm512_permute_ps(s2, 0xb1));  // [0] + [1]
  const __m512i first = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  _mm_storeu_ps(y, _mm512_castps512_ps128(_mm512_permutexvar_ps(first, s1)));
}

}  // namespace
}  // namespace kvfleet::cpu::detail
