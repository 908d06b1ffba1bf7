#include <cmath>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {

void silu_mul(float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace kvfleet::cpu
