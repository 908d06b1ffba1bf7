#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Every dot product here runs over 16-element steps with two 8-lane fp32 accumulators, then a fixed
// horizontal sum, then a scalar tail. Which elements land in which lane depends only on the weight dtype:
//   f32/f16: lanes 0-7 of a0 take elements 0-7, a1 takes 8-15 (plain loads, F16C widening);
//   bf16:    a0 takes elements 0-3 and 8-11, a1 takes 4-7 and 12-15: the order in which interleaving the
//            16 raw weights with zeros (unpacklo/unpackhi) widens them in one instruction each. x is
//            permuted the same way once per step and shared by every row of a tile.
// A row's result therefore never depends on the tile, the batch or the thread that computes it.
struct Step {
  __m256 x0, x1;  // x for this step, in the dtype's lane order
};

inline Step load_x(const float* x, std::int64_t k, DType dt) {
  const __m256 lo = _mm256_loadu_ps(x + k), hi = _mm256_loadu_ps(x + k + 8);
  if (dt != DType::bf16) return {lo, hi};
  return {_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31)};
}

inline void fma_row(const Step& x, const std::uint8_t* row, std::int64_t k, DType dt, __m256& a0, __m256& a1) {
  if (dt == DType::f32) {
    const auto* p = reinterpret_cast<const float*>(row) + k;
    a0 = _mm256_fmadd_ps(x.x0, _mm256_loadu_ps(p), a0);
    a1 = _mm256_fmadd_ps(x.x1, _mm256_loadu_ps(p + 8), a1);
  } else if (dt == DType::f16) {
    const auto* p = reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint16_t*>(row) + k);
    a0 = _mm256_fmadd_ps(x.x0, _mm256_cvtph_ps(_mm_loadu_si128(p)), a0);
    a1 = _mm256_fmadd_ps(x.x1, _mm256_cvtph_ps(_mm_loadu_si128(p + 1)), a1);
  } else {  // bf16: a bf16 is the top half of an fp32
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const std::uint16_t*>(row) + k));
    const __m256i zero = _mm256_setzero_si256();
    a0 = _mm256_fmadd_ps(x.x0, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, w)), a0);
    a1 = _mm256_fmadd_ps(x.x1, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, w)), a1);
  }
}

float tail(const float* x, const void* row, DType dt, std::int64_t from, std::int64_t n, float s) {
  for (std::int64_t k = from; k < n; ++k) s += x[k] * load_as_f32(row, dt, static_cast<std::size_t>(k));
  return s;
}

// R weight rows (row_bytes apart) against one x; R = 4 lets the rows' FMA chains overlap and share x.
template <int R>
void dot_rows(const float* x, const std::uint8_t* rows, std::size_t row_bytes, DType dt, std::int64_t n, float* out) {
  const std::int64_t body = n & ~std::int64_t{15};
  __m256 a[R][2];
  for (auto& acc : a) acc[0] = acc[1] = _mm256_setzero_ps();
  for (std::int64_t k = 0; k < body; k += 16) {
    const Step xs = load_x(x, k, dt);
    for (int i = 0; i < R; ++i) fma_row(xs, rows + static_cast<std::size_t>(i) * row_bytes, k, dt, a[i][0], a[i][1]);
  }
  for (int i = 0; i < R; ++i)
    out[i] = tail(x, rows + static_cast<std::size_t>(i) * row_bytes, dt, body, n, hsum(_mm256_add_ps(a[i][0], a[i][1])));
}

}  // namespace

float dot(const float* x, WeightRef w, std::int64_t n) {
  float out;
  dot_rows<1>(x, static_cast<const std::uint8_t*>(w.data), 0, w.dtype, n, &out);
  return out;
}

void linear(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, WeightRef w, std::int64_t out,
            WeightRef bias, float* y) {
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  const std::size_t row_bytes = static_cast<std::size_t>(in) * dtype_size(w.dtype);
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
        for (; n + 4 <= n1; n += 4) dot_rows<4>(xt, base + static_cast<std::size_t>(n) * row_bytes, row_bytes, w.dtype, in, yt + n);
        for (; n < n1; ++n) dot_rows<1>(xt, base + static_cast<std::size_t>(n) * row_bytes, row_bytes, w.dtype, in, yt + n);
        if (bias.data)
          for (std::int64_t j = n0; j < n1; ++j) yt[j] += load_as_f32(bias.data, bias.dtype, static_cast<std::size_t>(j));
      }
    }
  });
}

}  // namespace kvfleet::cpu
