// Greedy sampling on the GPU: the index of each row's largest logit, ties to the lowest id, as
// kvfleet::sample() does at temperature 0 (CPU reference: std::max_element in engine/sample/sampler.cpp,
// and kernels/cpu/argmax.cpp). Comparisons only, so the result is exact.
#include <cfloat>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

constexpr int kThreads = 256;

struct Best {
  float v;
  std::int32_t i;
};

__device__ __forceinline__ Best better(Best a, Best b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

__global__ void argmax_kernel(const float* logits, std::int64_t vocab, std::int32_t* out) {
  __shared__ Best warp_best[kThreads / 32];
  const float* row = logits + blockIdx.x * vocab;
  Best best{-FLT_MAX, INT32_MAX};
  for (std::int64_t i = threadIdx.x; i < vocab; i += kThreads)
    best = better(best, {row[i], static_cast<std::int32_t>(i)});
  for (int o = 16; o > 0; o >>= 1)
    best = better(best, {__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)});
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) best = better(best, warp_best[w]);
    out[blockIdx.x] = best.i == INT32_MAX ? 0 : best.i;  // an all-NaN row: token 0, like max_element
  }
}

}  // namespace

void argmax_rows(const float* logits, std::int64_t rows, std::int64_t vocab, std::int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, out);
  check_launch("argmax_kernel");
}

}  // namespace kvfleet::cuda
