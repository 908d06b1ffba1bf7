#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

// Elements of row-wise work below which a split over the pool costs more than it saves (a hand-off is
// ~1 us spinning, tens of us through the futex on a loaded machine; a 768-wide norm row ~1 us).
constexpr std::int64_t kSplitElems = 16384;

std::int64_t row_grain(std::int64_t dim) { return std::max<std::int64_t>(1, kSplitElems / std::max<std::int64_t>(1, dim)); }

void norm_row(const float* x, std::int64_t dim, WeightRef w, float eps, float* out) {
  // Sum of squares in double: cheap at these sizes and closer to the reference.
  double ss = 0.0;
  for (std::int64_t d = 0; d < dim; ++d) ss += static_cast<double>(x[d]) * x[d];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
  for (std::int64_t d = 0; d < dim; ++d)
    out[d] = (x[d] * inv) * load_as_f32(w.data, w.dtype, static_cast<std::size_t>(d));
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
