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

// Loads 8 weights of row r at element k, widened to fp32.
struct RowLoader {
  const std::uint8_t* base;
  std::size_t row_bytes;
  DType dtype;
  __m256 operator()(std::int64_t r, std::int64_t k) const {
    const std::uint8_t* row = base + static_cast<std::size_t>(r) * row_bytes;
    if (dtype == DType::f32) return load8(reinterpret_cast<const float*>(row) + k);
    return load8(reinterpret_cast<const std::uint16_t*>(row) + k, dtype);
  }
};

float tail(const float* x, const void* row, DType dt, std::int64_t from, std::int64_t n, float s) {
  for (std::int64_t k = from; k < n; ++k) s += x[k] * load_as_f32(row, dt, static_cast<std::size_t>(k));
  return s;
}

// Four weight rows against one x: x is loaded once per step and the four rows' FMA chains overlap. Each
// row keeps exactly dot()'s accumulators and order, so results are bit-identical to four dot() calls.
void dot4(const float* x, const RowLoader& w, std::int64_t r, std::int64_t n, float* out) {
  const std::int64_t body = n & ~std::int64_t{15};
  __m256 a[4][2];
  for (auto& row : a) row[0] = row[1] = _mm256_setzero_ps();
  for (std::int64_t k = 0; k < body; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    for (int i = 0; i < 4; ++i) {
      a[i][0] = _mm256_fmadd_ps(x0, w(r + i, k), a[i][0]);
      a[i][1] = _mm256_fmadd_ps(x1, w(r + i, k + 8), a[i][1]);
    }
  }
  for (int i = 0; i < 4; ++i)
    out[i] = tail(x, w.base + static_cast<std::size_t>(r + i) * w.row_bytes, w.dtype, body, n,
                  hsum(_mm256_add_ps(a[i][0], a[i][1])));
}

}  // namespace

float dot(const float* x, WeightRef w, std::int64_t n) {
  const std::int64_t body = n & ~std::int64_t{15};
  const RowLoader load{static_cast<const std::uint8_t*>(w.data), 0, w.dtype};
  const float s = dot_impl(x, body, [&](std::int64_t k) { return load(0, k); });
  return tail(x, w.data, w.dtype, body, n, s);
}

void linear(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, WeightRef w, std::int64_t out,
            WeightRef bias, float* y) {
  const RowLoader load{static_cast<const std::uint8_t*>(w.data), static_cast<std::size_t>(in) * dtype_size(w.dtype),
                       w.dtype};
  // Output features are split across threads; within a thread, a tile of weight rows stays in cache while
  // every input row passes over it.
  constexpr std::int64_t kTile = 16;
  pool.parallel_for(out, 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t n0 = begin; n0 < end; n0 += kTile) {
      const std::int64_t n1 = std::min(end, n0 + kTile);
      for (std::int64_t t = 0; t < rows; ++t) {
        const float* xt = x + t * in;
        float* yt = y + t * out;
        std::int64_t n = n0;
        for (; n + 4 <= n1; n += 4) dot4(xt, load, n, in, yt + n);
        for (; n < n1; ++n) yt[n] = dot(xt, {load.base + static_cast<std::size_t>(n) * load.row_bytes, w.dtype}, in);
        if (bias.data)
          for (std::int64_t j = n0; j < n1; ++j) yt[j] += load_as_f32(bias.data, bias.dtype, static_cast<std::size_t>(j));
      }
    }
  });
}

}  // namespace kvfleet::cpu
