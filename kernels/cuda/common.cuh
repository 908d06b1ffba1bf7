// Device helpers shared by the kernels: typed loads widened to fp32, fixed-order warp sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/ops.h"

namespace kvfleet::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// Butterfly sum over the warp: every lane ends with the same value, in an order fixed by the lane ids.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace kvfleet::cuda

// Calls f with the element type matching a DType: f(float{}), f(__nv_bfloat16{}) or f(__half{}).
#define KVF_DISPATCH_DTYPE(dt, T, ...) \
  switch (dt) {                        \
    case ::kvfleet::DType::f32: {      \
      using T = float;                 \
      __VA_ARGS__;                     \
    } break;                           \
    case ::kvfleet::DType::bf16: {     \
      using T = __nv_bfloat16;         \
      __VA_ARGS__;                     \
    } break;                           \
    case ::kvfleet::DType::f16: {      \
      using T = __half;                \
      __VA_ARGS__;                     \
    } break;                           \
  }
