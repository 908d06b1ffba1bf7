#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

// 8 fp32 lanes from 8 weights of each dtype.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const std::uint16_t* p, DType t) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (t == DType::f16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
}

inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Two 8-lane accumulators over 16-element steps (n is a multiple of 16), then a fixed horizontal sum.
template <class Load>
inline float dot_impl(const float* x, std::int64_t n, Load load) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (std::int64_t k = 0; k < n; k += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load(k), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), load(k + 8), a1);
  }
  return hsum(_mm256_add_ps(a0, a1));
}

}  // namespace

float dot(const float* x, WeightRef w, std::int64_t n) {
  const std::int64_t body = n & ~std::int64_t{15};
  float s;
  if (w.dtype == DType::f32) {
    const auto* p = static_cast<const float*>(w.data);
    s = dot_impl(x, body, [p](std::int64_t k) { return load8(p + k); });
  } else {
    const auto* p = static_cast<const std::uint16_t*>(w.data);
    const DType t = w.dtype;
    s = dot_impl(x, body, [p, t](std::int64_t k) { return load8(p + k, t); });
  }
  for (std::int64_t k = body; k < n; ++k) s += x[k] * load_as_f32(w.data, w.dtype, static_cast<std::size_t>(k));
  return s;
}

void linear(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, WeightRef w, std::int64_t out,
            WeightRef bias, float* y) {
  const std::size_t row_bytes = static_cast<std::size_t>(in) * dtype_size(w.dtype);
  // Output features are split across threads; within a thread, a tile of weight rows stays in cache while
  // every input row passes over it.
  constexpr std::int64_t kTile = 8;
  pool.parallel_for(out, 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t n0 = begin; n0 < end; n0 += kTile) {
      const std::int64_t n1 = std::min(end, n0 + kTile);
      for (std::int64_t t = 0; t < rows; ++t) {
        const float* xt = x + t * in;
        float* yt = y + t * out;
        for (std::int64_t n = n0; n < n1; ++n) {
          const WeightRef row{static_cast<const std::uint8_t*>(w.data) + n * row_bytes, w.dtype};
          float s = dot(xt, row, in);
          if (bias.data) s += load_as_f32(bias.data, bias.dtype, static_cast<std::size_t>(n));
          yt[n] = s;
        }
      }
    }
  });
}

}  // namespace kvfleet::cpu
