#include <cmath>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

void norm_row(const float* x, std::int64_t dim, WeightRef w, float eps, float* out) {
  // Sum of squares in double: cheap at these sizes and closer to the reference.
  double ss = 0.0;
  for (std::int64_t d = 0; d < dim; ++d) ss += static_cast<double>(x[d]) * x[d];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
  for (std::int64_t d = 0; d < dim; ++d)
    out[d] = (x[d] * inv) * load_as_f32(w.data, w.dtype, static_cast<std::size_t>(d));
}

}  // namespace

void rms_norm(const float* x, std::int64_t rows, std::int64_t dim, WeightRef w, float eps, float* out) {
  for (std::int64_t r = 0; r < rows; ++r) norm_row(x + r * dim, dim, w, eps, out + r * dim);
}

void add_rms_norm(float* residual, const float* delta, std::int64_t rows, std::int64_t dim, WeightRef w, float eps,
                  float* out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* res = residual + r * dim;
    for (std::int64_t d = 0; d < dim; ++d) res[d] += delta[r * dim + d];
    norm_row(res, dim, w, eps, out + r * dim);
  }
}

}  // namespace kvfleet::cpu
