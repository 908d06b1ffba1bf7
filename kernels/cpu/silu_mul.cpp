// silu(g) * u with e^-g from Cephes' expf polynomial (exp_poly.h, the one attention's softmax uses, within
// 2 ulp of expf) instead of a libm call per element, 8 elements at a time in GCC/Clang vector types (AVX2
// with the build's -march); the last n mod 8 go through the same vector code (padded), so every element,
// wherever it falls, gets the same bits. One implementation for every instruction-set path.
#include <cstring>

#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

using V8 = detail::Float8;

// e^-g clamped at e^88 (g < -88: silu(g) ~ g e^g is under 1e-36 either way); a NaN g stays NaN.
inline V8 silu_mul8(V8 g, V8 u) {
  const V8 x = -g;
  return g / (1.0f + detail::exp_poly8(x < 88.0f ? x : V8{} + 88.0f)) * u;
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
