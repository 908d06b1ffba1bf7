#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {

void embedding(WeightRef table, std::int64_t dim, const std::int32_t* ids, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const auto base = static_cast<std::size_t>(ids[i]) * static_cast<std::size_t>(dim);
    for (std::int64_t d = 0; d < dim; ++d)
      out[i * dim + d] = load_as_f32(table.data, table.dtype, base + static_cast<std::size_t>(d));
  }
}

}  // namespace kvfleet::cpu
