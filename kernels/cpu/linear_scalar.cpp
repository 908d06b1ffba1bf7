// The scalar kernel: the arithmetic of linear_kernels.h written out plainly. It is the fallback for a CPU
// without AVX2 and the reference the vector kernels are tested against (bit for bit).
#include <cmath>

#include "kernels/cpu/linear_kernels.h"

namespace kvfleet::cpu::detail {
namespace {

// The element of block position i (0..31), relative to the block start.
std::int64_t block_element(DType dt, std::int64_t i) {
  if (dt != DType::bf16) return i;
  return i < kLanes ? 2 * i : 2 * (i - kLanes) + 1;
}

}  // namespace

void set_layout(GemmArgs& g, DType dtype, bool packed) {
  const std::size_t elem = dtype_size(dtype);
  g.dtype = dtype;
  g.packed = packed;
  g.full = packed ? g.kp : g.in / kBlock * kBlock;
  const std::size_t row = static_cast<std::size_t>(packed ? g.kp : g.in) * elem;
  g.panel_bytes = static_cast<std::size_t>(kPanel) * row;
  g.feature_bytes = packed ? static_cast<std::size_t>(kBlock) * elem : row;
  g.block_step = static_cast<std::size_t>(packed ? kPanel * kBlock : kBlock) * elem;
}

void block_weights(const std::uint8_t* blk, DType dt, std::int64_t valid, float* lo, float* hi) {
  for (std::int64_t j = 0; j < kLanes; ++j) {
    const std::int64_t a = block_element(dt, j), b = block_element(dt, kLanes + j);
    lo[j] = a < valid ? load_as_f32(blk, dt, static_cast<std::size_t>(a)) : 0.0f;
    hi[j] = b < valid ? load_as_f32(blk, dt, static_cast<std::size_t>(b)) : 0.0f;
  }
}

void gemm_scalar(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  float lo[kLanes], hi[kLanes];
  for (std::int64_t n = n0; n < n1; ++n) {
    const std::uint8_t* feature = a.w + static_cast<std::size_t>(n / kPanel) * a.panel_bytes +
                                  static_cast<std::size_t>(n % kPanel) * a.feature_bytes;
    for (std::int64_t t = 0; t < a.rows; ++t) {
      const float* x = a.xa + t * a.kp;
      float l[kLanes] = {};
      for (std::int64_t b = 0; b < a.kp; b += kBlock) {
        block_weights(feature + static_cast<std::size_t>(b / kBlock) * a.block_step, a.dtype,
                      b < a.full ? kBlock : a.in - b, lo, hi);
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
