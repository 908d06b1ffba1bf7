// RMSNorm, optionally fused with the residual add (CPU reference: kernels/cpu/rms_norm.cpp). One block per
// row; the sum of squares is taken in double, as on the CPU, in an order fixed by the thread ids.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

constexpr int kThreads = 256;

template <typename W, bool kAdd>
__global__ void rms_norm_kernel(float* x_or_residual, const float* delta, std::int64_t dim, const W* w, float eps,
                                float* out) {
  __shared__ double partial[kThreads / 32];
  const std::int64_t row = blockIdx.x;
  float* x = x_or_residual + row * dim;
  double ss = 0.0;
  for (std::int64_t d = threadIdx.x; d < dim; d += kThreads) {
    float v = x[d];
    if constexpr (kAdd) {
      v += delta[row * dim + d];
      x[d] = v;
    }
    ss += static_cast<double>(v) * v;
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  double total = 0.0;
  for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
  const float inv = static_cast<float>(1.0 / sqrt(total / static_cast<double>(dim) + eps));
  for (std::int64_t d = threadIdx.x; d < dim; d += kThreads) out[row * dim + d] = (x[d] * inv) * to_float(w[d]);
}

template <bool kAdd>
void launch(float* x, const float* delta, std::int64_t rows, std::int64_t dim, WeightRef w, float eps, float* out,
            cudaStream_t stream) {
  if (rows == 0) return;
  KVF_DISPATCH_DTYPE(w.dtype, W,
                     rms_norm_kernel<W, kAdd><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
                         x, delta, dim, static_cast<const W*>(w.data), eps, out));
  check_launch(kAdd ? "rms_norm_kernel (add)" : "rms_norm_kernel");
}

}  // namespace

void rms_norm(const float* x, std::int64_t rows, std::int64_t dim, WeightRef w, float eps, float* out,
              cudaStream_t stream) {
  // The kernel only writes x when adding; the cast keeps one kernel for both.
  launch<false>(const_cast<float*>(x), nullptr, rows, dim, w, eps, out, stream);
}

void add_rms_norm(float* residual, const float* delta, std::int64_t rows, std::int64_t dim, WeightRef w, float eps,
                  float* out, cudaStream_t stream) {
  launch<true>(residual, delta, rows, dim, w, eps, out, stream);
}

}  // namespace kvfleet::cuda
