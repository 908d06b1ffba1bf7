// Greedy token choice for a batch of logit rows: the CPU reference of kernels/cuda/argmax.cu, the same
// rule as kvfleet::sample() at temperature 0 (the first maximum: ties go to the lowest id).
#include <algorithm>

#include "kernels/cpu/ops_extra.h"

namespace kvfleet::cpu {

void argmax_rows(const float* logits, std::int64_t rows, std::int64_t vocab, std::int32_t* out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    out[r] = static_cast<std::int32_t>(std::max_element(row, row + vocab) - row);
  }
}

}  // namespace kvfleet::cpu
