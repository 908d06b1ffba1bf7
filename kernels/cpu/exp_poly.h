// e^x on 8 lanes from Cephes' expf polynomial (within 2 ulp of expf), in GCC/Clang vector types: the one
// exp of attention's softmax (paged_attention.cpp, for x <= 0) and of silu (silu_mul.cpp, x <= 88, clamped
// by the caller). Plain arithmetic, so loops over it vectorize with the build's -march (AVX2) where calls to
// expf would not. Below -87 it returns 0 (e^-87 ~ 1.6e-38), and e^-inf is 0.
// Include it only from files built with the project's default flags: an inline function compiled in an
// AVX-512 file could be the copy the linker keeps for every caller (attention_avx512.cpp has its own).
#pragma once

#include <cstdint>

namespace kvfleet::cpu::detail {

typedef float Float8 __attribute__((vector_size(32)));
typedef std::int32_t Int8 __attribute__((vector_size(32)));

inline Float8 exp_poly8(Float8 x) {
  const Int8 tiny = x < -87.0f;
  x = tiny ? Float8{} - 87.0f : x;
  const Float8 t = x * 1.44269504088896341f + 0.5f;
  Float8 n = __builtin_convertvector(__builtin_convertvector(t, Int8), Float8);
  n = n > t ? n - 1.0f : n;  // floor: truncation corrected downwards
  Float8 r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  Float8 p = Float8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const Float8 scale = (Float8)((__builtin_convertvector(n, Int8) + 127) << 23);
  return tiny ? Float8{} : p * scale;
}

}  // namespace kvfleet::cpu::detail
