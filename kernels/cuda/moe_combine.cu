// Unpermute + weighted combine of the expert outputs, and Qwen2-MoE's gated shared-expert add (CPU
// references: kernels/cpu/moe_experts.cpp's combine loop, cpu::sigmoid_scale_add). One thread per output
// element, summing the k expert outputs in rank order from zero. expf as on the CPU.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/moe.h"

namespace kvfleet::cuda {
namespace {

__global__ void moe_combine_kernel(const float* ys, const std::int32_t* position, const float* weights,
                                   std::int64_t rows, std::int64_t top_k, std::int64_t hidden, float* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows * hidden;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / hidden, d = i % hidden;
    float acc = 0.0f;
    for (std::int64_t j = 0; j < top_k; ++j) acc += weights[r * top_k + j] * ys[position[r * top_k + j] * hidden + d];
    out[i] = acc;
  }
}

__global__ void sigmoid_scale_add_kernel(float* acc, const float* x, const float* gate, std::int64_t rows,
                                         std::int64_t dim) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows * dim;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float s = 1.0f / (1.0f + expf(-gate[i / dim]));
    acc[i] += s * x[i];
  }
}

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65535)); }

}  // namespace

void moe_combine(const float* ys, const std::int32_t* position, const float* weights, std::int64_t rows,
                 std::int64_t top_k, std::int64_t hidden, float* out, cudaStream_t stream) {
  if (rows == 0) return;
  moe_combine_kernel<<<blocks_for(rows * hidden), 256, 0, stream>>>(ys, position, weights, rows, top_k, hidden, out);
  check_launch("moe_combine_kernel");
}

void sigmoid_scale_add(float* acc, const float* x, const float* gate, std::int64_t rows, std::int64_t dim,
                       cudaStream_t stream) {
  if (rows == 0) return;
  sigmoid_scale_add_kernel<<<blocks_for(rows * dim), 256, 0, stream>>>(acc, x, gate, rows, dim);
  check_launch("sigmoid_scale_add_kernel");
}

}  // namespace kvfleet::cuda
