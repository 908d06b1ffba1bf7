#include <cmath>

#include "kernels/cpu/moe.h"

namespace kvfleet::cpu {

void moe_route(const float* logits, std::int64_t rows, std::int64_t num_experts, std::int64_t top_k,
               bool renormalize, std::int32_t* ids, float* weights) {
  std::vector<float> p(static_cast<std::size_t>(num_experts));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * num_experts;
    float max = l[0];
    for (std::int64_t e = 1; e < num_experts; ++e) max = std::max(max, l[e]);
    float sum = 0.0f;
    for (std::int64_t e = 0; e < num_experts; ++e) sum += p[static_cast<std::size_t>(e)] = std::exp(l[e] - max);
    for (auto& v : p) v /= sum;
    // Selection by repeated argmax: k is small (2-8), and the strict > keeps the lower id on a tie.
    std::int32_t* row_ids = ids + r * top_k;
    float* row_w = weights + r * top_k;
    std::vector<bool> taken(static_cast<std::size_t>(num_experts), false);
    float kept = 0.0f;
    for (std::int64_t j = 0; j < top_k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < num_experts; ++e)
        if (!taken[static_cast<std::size_t>(e)] && (best < 0 || p[static_cast<std::size_t>(e)] > p[static_cast<std::size_t>(best)])) best = e;
      taken[static_cast<std::size_t>(best)] = true;
      row_ids[j] = static_cast<std::int32_t>(best);
      row_w[j] = p[static_cast<std::size_t>(best)];
      kept += row_w[j];
    }
    if (renormalize)
      for (std::int64_t j = 0; j < top_k; ++j) row_w[j] /= kept;
  }
}

void sigmoid_scale_add(float* acc, const float* x, const float* gate, std::int64_t rows, std::int64_t dim) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float s = 1.0f / (1.0f + std::exp(-gate[r]));
    for (std::int64_t d = 0; d < dim; ++d) acc[r * dim + d] += s * x[r * dim + d];
  }
}

}  // namespace kvfleet::cpu
