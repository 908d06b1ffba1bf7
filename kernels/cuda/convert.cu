// Element-wise dtype conversions: activations to bf16/f16 for cuBLAS, cache blocks back to fp32.
// CPU reference: f32_to_bf16 / f32_to_f16 / load_as_f32 in kvfleet/dtype.h (round to nearest even).
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

template <typename From, typename To>
__global__ void convert_kernel(const From* x, std::int64_t n, To* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<To>(to_float(x[i]));
}

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65535)); }

}  // namespace

void f32_to_half(const float* x, std::int64_t n, DType to, void* out, cudaStream_t stream) {
  if (n == 0) return;
  KVF_DISPATCH_DTYPE(to, T, convert_kernel<float, T><<<blocks_for(n), 256, 0, stream>>>(x, n, static_cast<T*>(out)));
  check_launch("convert_kernel (f32 to half)");
}

void to_f32(const void* x, DType from, std::int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  KVF_DISPATCH_DTYPE(from, T,
                     convert_kernel<T, float><<<blocks_for(n), 256, 0, stream>>>(static_cast<const T*>(x), n, out));
  check_launch("convert_kernel (to f32)");
}

}  // namespace kvfleet::cuda
