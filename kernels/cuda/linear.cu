// y = x . w^T + bias with fp32 activations and weights in their checkpoint dtype (CPU reference:
// kernels/cpu/linear.cpp). The batch-invariant GEMM: a warp computes one output feature for a tile of up
// to kRows rows; lane l takes the 8-element chunks l, l + 32, ... of the reduction in that order, then a
// fixed butterfly sums the lanes. Which rows share the tile never changes a row's arithmetic, so the
// result of a row is the same at batch 1 and batch 256. CUDA cores, fp32: the fast path is cuBLAS
// (CudaBackend with batch_invariant = false); what invariance costs is measured on the GPU machine (bench/device).
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

constexpr int kRows = 8;   // rows per tile: each weight chunk is loaded once for all of them
constexpr int kWarps = 4;  // output features per block

// Eight consecutive weights widened to fp32. `vec`: the row is 16-byte aligned and in % 8 == 0.
template <typename W>
__device__ __forceinline__ void load8(const W* w, std::int64_t k, std::int64_t in, bool vec, float (&out)[8]) {
  if (vec) {
    if constexpr (sizeof(W) == 2) {
      const uint4 raw = *reinterpret_cast<const uint4*>(w + k);
      const W* h = reinterpret_cast<const W*>(&raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) out[e] = to_float(h[e]);
    } else {
      const float4 a = *reinterpret_cast<const float4*>(w + k), b = *reinterpret_cast<const float4*>(w + k + 4);
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = k + e < in ? to_float(w[k + e]) : 0.0f;
}

template <typename W>
__global__ void __launch_bounds__(kWarps * 32)
    linear_kernel(const float* x, std::int64_t rows, std::int64_t in, const W* w, std::int64_t out, const W* bias,
                  float* y, bool vec) {
  const int lane = threadIdx.x % 32;
  const std::int64_t n = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  const std::int64_t r0 = blockIdx.y * static_cast<std::int64_t>(kRows);
  if (n >= out) return;
  const int tile = static_cast<int>(rows - r0 < kRows ? rows - r0 : kRows);
  const W* wn = w + n * in;
  float acc[kRows] = {};
  for (std::int64_t k = lane * 8; k < in; k += 32 * 8) {
    float wv[8];
    load8(wn, k, in, vec, wv);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= tile) break;
      const float* xr = x + (r0 + r) * in + k;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (vec || k + e < in) acc[r] = fmaf(xr[e], wv[e], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= tile) break;
    const float s = warp_sum(acc[r]);
    if (lane == 0) y[(r0 + r) * out + n] = bias ? s + to_float(bias[n]) : s;
  }
}

template <typename W>
__global__ void add_bias_kernel(float* y, std::int64_t rows, std::int64_t out, const W* bias) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows * out;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] += to_float(bias[i % out]);
}

}  // namespace

void linear(const float* x, std::int64_t rows, std::int64_t in, WeightRef w, std::int64_t out, WeightRef bias, float* y,
            cudaStream_t stream) {
  if (rows == 0 || out == 0) return;
  // A bias in another dtype than the weight (rare) is added by a second kernel: one instantiation per dtype.
  if (bias.data && bias.dtype != w.dtype) {
    linear(x, rows, in, w, out, {}, y, stream);
    return add_bias(y, rows, out, bias, stream);
  }
  // Depends on the weight alone, never on x or the batch: both paths sum in the same order anyway.
  const bool vec = in % 8 == 0 && reinterpret_cast<std::uintptr_t>(w.data) % 16 == 0;
  const dim3 grid(static_cast<unsigned>((out + kWarps - 1) / kWarps),
                  static_cast<unsigned>((rows + kRows - 1) / kRows));
  KVF_DISPATCH_DTYPE(w.dtype, W,
                     linear_kernel<W><<<grid, kWarps * 32, 0, stream>>>(x, rows, in, static_cast<const W*>(w.data), out,
                                                                        static_cast<const W*>(bias.data), y, vec));
  check_launch("linear_kernel");
}

void add_bias(float* y, std::int64_t rows, std::int64_t out, WeightRef bias, cudaStream_t stream) {
  if (!bias.data || rows == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((rows * out + 255) / 256, 65535));
  KVF_DISPATCH_DTYPE(bias.dtype, W,
                     add_bias_kernel<W><<<blocks, 256, 0, stream>>>(y, rows, out, static_cast<const W*>(bias.data)));
  check_launch("add_bias_kernel");
}

}  // namespace kvfleet::cuda
