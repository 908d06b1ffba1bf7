// The scalar kernel: the arithmetic of linear_kernels.h written out plainly. It is the fallback for a CPU
// without AVX2 and the reference the vector kernels are tested against (bit for bit).
#include <cmath>

#include "kernels/cpu/linear_kernels.h"

namespace kvfleet::cpu::detail {
namespace {

float weight_at(const std::uint8_t* row, DType dt, std::int64_t k) {
  return load_as_f32(row, dt, static_cast<std::size_t>(k));
}

// The element of block position i (0..31), relative to the block start.
std::int64_t block_element(DType dt, std::int64_t i) {
  if (dt != DType::bf16) return i;
  return i < kLanes ? 2 * i : 2 * (i - kLanes) + 1;
}

}  // namespace

void tail_weights(const std::uint8_t* row, DType dt, std::int64_t block_start, std::int64_t in, float* lo, float* hi) {
  for (std::int64_t j = 0; j < kLanes; ++j) {
    const std::int64_t a = block_start + block_element(dt, j), b = block_start + block_element(dt, kLanes + j);
    lo[j] = a < in ? weight_at(row, dt, a) : 0.0f;
    hi[j] = b < in ? weight_at(row, dt, b) : 0.0f;
  }
}

void gemm_scalar(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  float lo[kLanes], hi[kLanes];
  for (std::int64_t n = n0; n < n1; ++n) {
    const std::uint8_t* row = a.w + static_cast<std::size_t>(n) * a.row_bytes;
    for (std::int64_t t = 0; t < a.rows; ++t) {
      const float* x = a.xa + t * a.kp;
      float l[kLanes] = {};
      for (std::int64_t b = 0; b < a.kp; b += kBlock) {
        tail_weights(row, a.dtype, b, a.in, lo, hi);
        for (std::int64_t j = 0; j < kLanes; ++j) l[j] = std::fma(x[b + j], lo[j], l[j]);
        for (std::int64_t j = 0; j < kLanes; ++j) l[j] = std::fma(x[b + kLanes + j], hi[j], l[j]);
      }
      for (int i = 0; i < 8; ++i) l[i] += l[i + 8];
      for (int i = 0; i < 4; ++i) l[i] += l[i + 4];
      for (int i = 0; i < 2; ++i) l[i] += l[i + 2];
      a.y[t * a.ldy + n] = l[0] + l[1];
    }
  }
}

}  // namespace kvfleet::cpu::detail
