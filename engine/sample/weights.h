// The sampler's softmax weights: exp((logit - max) / temperature) in float, by a polynomial the compiler
// vectorises (no libm call per entry). Every path of sample() and sample_reference() computes a weight with
// this one function, element by element, so that a weight is the same float whatever the path, the batch,
// the thread or the vector width (sampler.cpp is built with -ffp-contract=off: no fused multiply-add may
// make a vectorised loop differ from a scalar call).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kvfleet::sampler_detail {

// NaN compares as -inf, so that every ordering is a strict weak ordering and a NaN is never chosen.
inline float ordered(float l) { return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l; }

// exp(x) for x <= 0: Cephes expf's range reduction (x = n ln2 + r, |r| <= ln2 / 2, ln2 in two parts) and
// its degree-5 polynomial (relative error under 2e-7), 2^n put in the exponent bits. 0 below -87, where
// expf would go subnormal: such a weight is under 2^-125 of the maximum's (1) and invisible to any sum.
// Round-to-nearest of x log2(e) by adding and subtracting 1.5 * 2^23 (exact for |x| < 2^22).
inline float exp_weight(float x) {
  const float xc = x < -87.0f ? -87.0f : x > 0.0f ? 0.0f : x;  // > 0 only if max_l is not the maximum
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : y * scale;
}

// The weight of one logit: exp_weight((ordered(l) - max_l) / temperature).
inline float weight(float l, float max_l, float temperature) { return exp_weight((ordered(l) - max_l) / temperature); }

}  // namespace kvfleet::sampler_detail
