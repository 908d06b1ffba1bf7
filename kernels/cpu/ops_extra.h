// CPU references for CUDA kernels that the CPU backend itself does not need (new files only, so that
// ops.h and the CPU backend stay as they are).
#pragma once

#include <cstdint>

namespace kvfleet::cpu {

// out[r] = the lowest index of the largest value of logits row r (reference of kernels/cuda/argmax.cu).
void argmax_rows(const float* logits, std::int64_t rows, std::int64_t vocab, std::int32_t* out);

}  // namespace kvfleet::cpu
