#include <cmath>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {

void silu_mul(float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// ~4 ns an element (expf): 16k elements (one 2048-wide decode row is 2k) are worth a hand-off.
void silu_mul(ThreadPool& pool, float* gate, const float* up, std::int64_t n) {
  pool.parallel_for(n, 16384, [&](std::int64_t b, std::int64_t e) { silu_mul(gate + b, up + b, e - b); });
}

}  // namespace kvfleet::cpu
