#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

// Elements of row-wise work below which a split over the pool costs more than it saves (a hand-off is
// ~1 us spinning, tens of us through the futex on a loaded machine; a 768-wide norm row ~1 us).
constexpr std::int64_t kSplitElems = 16384;

std::int64_t row_grain(std::int64_t dim) { return std::max<std::int64_t>(1, kSplitElems / std::max<std::int64_t>(1, dim)); }

// Sum of squares in double (cheap at these sizes and closer to the reference), as 8 partial sums over the
// elements i mod 8 combined as a fixed tree, so that the loop vectorizes (one chain of dim dependent adds
// did not: ~1 us for a 768-wide row); the order is a function of dim alone.
double sum_of_squares(const float* x, std::int64_t dim) {
  double s[8] = {};
  std::int64_t d = 0;
  for (; d + 8 <= dim; d += 8)
    for (int u = 0; u < 8; ++u) s[u] = std::fma(static_cast<double>(x[d + u]), static_cast<double>(x[d + u]), s[u]);
  for (int u = 0; d + u < dim; ++u) s[u] = std::fma(static_cast<double>(x[d + u]), static_cast<double>(x[d + u]), s[u]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// out = (x * inv) * w, with the weight's dtype switched on once per row, not per element.
void scale_row(const float* x, std::int64_t dim, WeightRef w, float inv, float* out) {
  switch (w.dtype) {
    case DType::f32: {
      const auto* wf = static_cast<const float*>(w.data);
      for (std::int64_t d = 0; d < dim; ++d) out[d] = (x[d] * inv) * wf[d];
      return;
    }
    case DType::bf16: {
      const auto* wb = static_cast<const std::uint16_t*>(w.data);
      for (std::int64_t d = 0; d < dim; ++d) out[d] = (x[d] * inv) * bf16_to_f32(wb[d]);
      return;
    }
    case DType::f16: break;
  }
  for (std::int64_t d = 0; d < dim; ++d)
    out[d] = (x[d] * inv) * load_as_f32(w.data, w.dtype, static_cast<std::size_t>(d));
}

void norm_row(const float* x, std::int64_t dim, WeightRef w, float eps, float* out) {
  const double ss = sum_of_squares(x, dim);
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
  scale_row(x, dim, w, inv, out);
}

void add_norm_row(float* res, const float* delta, std::int64_t dim, WeightRef w, float eps, float* out) {
  for (std::int64_t d = 0; d < dim; ++d) res[d] += delta[d];
  norm_row(res, dim, w, eps, out);
}

}  // namespace

void rms_norm(const float* x, std::int64_t rows, std::int64_t dim, WeightRef w, float eps, float* out) {
  for (std::int64_t r = 0; r < rows; ++r) norm_row(x + r * dim, dim, w, eps, out + r * dim);
}

void add_rms_norm(float* residual, const float* delta, std::int64_t rows, std::int64_t dim, WeightRef w, float eps,
                  float* out) {
  for (std::int64_t r = 0; r < rows; ++r) add_norm_row(residual + r * dim, delta + r * dim, dim, w, eps, out + r * dim);
}

void rms_norm(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t dim, WeightRef w, float eps,
              float* out) {
  pool.parallel_for(rows, row_grain(dim), [&](std::int64_t r0, std::int64_t r1) {
    rms_norm(x + r0 * dim, r1 - r0, dim, w, eps, out + r0 * dim);
  });
}

void add_rms_norm(ThreadPool& pool, float* residual, const float* delta, std::int64_t rows, std::int64_t dim,
                  WeightRef w, float eps, float* out) {
  pool.parallel_for(rows, row_grain(dim), [&](std::int64_t r0, std::int64_t r1) {
    add_rms_norm(residual + r0 * dim, delta + r0 * dim, r1 - r0, dim, w, eps, out + r0 * dim);
  });
}

}  // namespace kvfleet::cpu
