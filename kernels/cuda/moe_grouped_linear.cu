// The grouped GEMM of an MoE layer: every expert's rows in one launch (CPU reference: cpu::linear per
// expert in kernels/cpu/moe_experts.cpp). A warp computes one output feature for a tile of slots, each
// slot against the weight of the expert that owns it (found in `offsets` by binary search); lane l takes
// the 8-element chunks l, l + 32, ... of the reduction and a fixed butterfly sums the lanes, as in
// linear.cu, so a slot's result never depends on the other slots.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"

namespace kvfleet::cuda {
namespace {

constexpr int kRows = 8;
constexpr int kWarps = 4;

__device__ __forceinline__ int expert_of(const std::int32_t* offsets, int experts, std::int64_t slot) {
  int lo = 0, hi = experts - 1;  // the last e with offsets[e] <= slot
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= slot) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <typename W>
__global__ void __launch_bounds__(kWarps * 32)
    grouped_linear_kernel(const float* x, const std::int32_t* source, std::int64_t slots, std::int64_t in,
                          const void* const* weights, int experts, const std::int32_t* offsets, std::int64_t out,
                          float* y) {
  const int lane = threadIdx.x % 32;
  const std::int64_t n = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  if (n >= out) return;
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t slot = blockIdx.y * static_cast<std::int64_t>(kRows) + r;
    if (slot >= slots) break;
    const W* w = static_cast<const W*>(weights[expert_of(offsets, experts, slot)]) + n * in;
    const float* xr = x + (source ? source[slot] : slot) * in;
    float acc = 0.0f;
    for (std::int64_t k = lane * 8; k < in; k += 32 * 8)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (k + e < in) acc = fmaf(xr[k + e], to_float(w[k + e]), acc);
    acc = warp_sum(acc);
    if (lane == 0) y[slot * out + n] = acc;
  }
}

}  // namespace

void moe_grouped_linear(const float* x, const std::int32_t* source, std::int64_t slots, std::int64_t in,
                        const void* const* weights, DType dtype, std::int64_t num_experts, const std::int32_t* offsets,
                        std::int64_t out, float* y, cudaStream_t stream) {
  if (slots == 0 || out == 0) return;
  const dim3 grid(static_cast<unsigned>((out + kWarps - 1) / kWarps), static_cast<unsigned>((slots + kRows - 1) / kRows));
  const int e = static_cast<int>(num_experts);
  KVF_DISPATCH_DTYPE(dtype, W,
                     grouped_linear_kernel<W><<<grid, kWarps * 32, 0, stream>>>(x, source, slots, in, weights, e,
                                                                                offsets, out, y));
  check_launch("grouped_linear_kernel");
}

}  // namespace kvfleet::cuda
