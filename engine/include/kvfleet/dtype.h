// Element types of checkpoint tensors and their conversions to fp32.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kvfleet {

enum class DType : std::uint8_t { f32, f16, bf16 };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
  }
  return "?";
}

inline float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

// Round to nearest even, as torch does when casting to bfloat16.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

#if defined(__clang__) && __clang_major__ < 15
// Clang 14 (Debian's, used by the sanitizer and fuzz build) has no _Float16 on x86; its __fp16 is a
// storage type with the same IEEE conversions (round to nearest even), but cannot be a return value.
inline float f16_to_f32(std::uint16_t h) {
  __fp16 x;
  std::memcpy(&x, &h, sizeof x);
  return static_cast<float>(x);
}
inline std::uint16_t f32_to_f16(float f) {
  const __fp16 x = static_cast<__fp16>(f);
  std::uint16_t h;
  std::memcpy(&h, &x, sizeof h);
  return h;
}
#else
inline float f16_to_f32(std::uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
inline std::uint16_t f32_to_f16(float f) { return std::bit_cast<std::uint16_t>(static_cast<_Float16>(f)); }
#endif

// Reads element i of a tensor of type t as fp32.
inline float load_as_f32(const void* data, DType t, std::size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::f16: return f16_to_f32(static_cast<const std::uint16_t*>(data)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(data)[i]);
  }
  return 0.0f;
}

}  // namespace kvfleet
