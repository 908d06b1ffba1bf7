// gate = silu(gate) * up (CPU reference: kernels/cpu/silu_mul.cpp). expf, not __expf: same function as the CPU.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

__global__ void silu_mul_kernel(float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

}  // namespace

void silu_mul(float* gate, const float* up, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65535));
  silu_mul_kernel<<<blocks, 256, 0, stream>>>(gate, up, n);
  check_launch("silu_mul_kernel");
}

}  // namespace kvfleet::cuda
