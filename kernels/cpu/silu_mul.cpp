// silu(g) * u with e^-g from Cephes' expf polynomial (the one paged_attention.cpp's softmax uses, within
// 2 ulp of expf) instead of a libm call per element, 8 elements at a time in GCC/Clang vector types (AVX2
// with the build's -march); the last n mod 8 go through the same vector code (padded), so every element,
// wherever it falls, gets the same bits. One implementation for every instruction-set path.
#include <cstring>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef std::int32_t I8 __attribute__((vector_size(32)));

// e^x for x <= 88 (so that 2^n stays a normal float: the caller clamps); 0 below -87 (e^-87 ~ 1.6e-38).
// paged_attention.cpp's 8-lane exp_nonpositive with a wider range.
inline V8 exp_poly(V8 x) {
  const I8 tiny = x < -87.0f;
  x = tiny ? V8{} - 87.0f : x;
  const V8 t = x * 1.44269504088896341f + 0.5f;
  V8 n = __builtin_convertvector(__builtin_convertvector(t, I8), V8);
  n = n > t ? n - 1.0f : n;  // floor
  V8 r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  V8 p = V8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const V8 scale = (V8)((__builtin_convertvector(n, I8) + 127) << 23);
  return tiny ? V8{} : p * scale;
}

// e^-g clamped at e^88 (g < -88: silu(g) ~ g e^g is under 1e-36 either way); a NaN g stays NaN.
inline V8 silu_mul8(V8 g, V8 u) {
  const V8 x = -g;
  return g / (1.0f + exp_poly(x < 88.0f ? x : V8{} + 88.0f)) * u;
}

}  // namespace

void silu_mul(float* gate, const float* up, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 g, u;
    std::memcpy(&g, gate + i, sizeof g);
    std::memcpy(&u, up + i, sizeof u);
    g = silu_mul8(g, u);
    std::memcpy(gate + i, &g, sizeof g);
  }
  if (i == n) return;
  const auto rest = static_cast<std::size_t>(n - i) * sizeof(float);
  V8 g{}, u{};
  std::memcpy(&g, gate + i, rest);
  std::memcpy(&u, up + i, rest);
  g = silu_mul8(g, u);
  std::memcpy(gate + i, &g, rest);
}

// ~0.3 ns an element (was ~4 ns with libm's expf); 16k elements are still worth a hand-off in prefill (a
// 2048-wide decode row, 2k, stays on the caller).
void silu_mul(ThreadPool& pool, float* gate, const float* up, std::int64_t n) {
  pool.parallel_for(n, 16384, [&](std::int64_t b, std::int64_t e) { silu_mul(gate + b, up + b, e - b); });
}

}  // namespace kvfleet::cpu
