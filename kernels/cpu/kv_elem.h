// The element types the CPU KV cache can hold (--kv-cache-dtype): fp32, bf16 or fp16 storage, fp32
// arithmetic always. widen/narrow convert a run of elements; written as plain loops so that the compiler
// vectorizes them (bf16 is a shift, fp16 is F16C's vcvtph2ps/vcvtps2ph).
#pragma once

#include <cstdint>
#include <cstring>

#include "kvfleet/dtype.h"

namespace kvfleet::cpu {

struct Bf16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};

inline void widen(const float* src, float* dst, std::int64_t n) {
  std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}
inline void widen(const Bf16* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i].bits);
}
inline void widen(const F16* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i].bits);
}

inline void narrow(const float* src, float* dst, std::int64_t n) {
  std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}
inline void narrow(const float* src, Bf16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i].bits = f32_to_bf16(src[i]);
}
inline void narrow(const float* src, F16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i].bits = f32_to_f16(src[i]);
}

// Calls fn(T{}) with T the storage type of `dtype`: one switch where a kernel picks its instantiation.
template <class Fn>
decltype(auto) with_kv_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::bf16: return fn(Bf16{});
    case DType::f16: return fn(F16{});
    case DType::f32: break;
  }
  return fn(float{});
}

}  // namespace kvfleet::cpu
