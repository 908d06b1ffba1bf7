// The inner kernels of cpu::linear, one per instruction set, and the arithmetic all of them share.
//
// The arithmetic of one output element y[t][n] (fixed: it depends on nothing but the weight dtype):
//   - The reduction dimension runs in blocks of 32 elements, zero-padded at the end, into 16 fp32 lanes.
//     In each block, lane j first takes x[p(j)] * w[p(j)], then x[p(16 + j)] * w[p(16 + j)], each a fused
//     multiply-add into the lane, where p is the block's element order:
//       f32, f16: p(i) = i                      (plain loads: elements j and 16 + j);
//       bf16:     p(j) = 2j, p(16 + j) = 2j + 1 (a 32-bit load holds a bf16 pair: the even element is the
//                                                word shifted left by 16, the odd one the word masked).
//   - Then a fixed tree over the lanes: l[i] + l[i + 8], then + [i + 4], then + [i + 2], then [0] + [1].
//   - Then + bias[n], in the caller.
// x is rearranged once per call into that order ("arranged x": per row, kp floats, block by block), so
// every kernel reads it with plain loads. The scalar, AVX2 and AVX-512 kernels perform exactly these
// operations, so they agree bit for bit, and a row's result is the same whatever the number of rows, the
// tile it falls in or the thread that runs it (batch invariance, DESIGN.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvfleet/dtype.h"

namespace kvfleet::cpu::detail {

constexpr std::int64_t kBlock = 32;  // reduction elements per block
constexpr std::int64_t kLanes = 16;

inline std::int64_t arranged_len(std::int64_t in) { return (in + kBlock - 1) / kBlock * kBlock; }

// One call's operands: y[t * ldy + n] = sum_k x[t][k] * w[n][k] for t < rows and n in the caller's range.
struct GemmArgs {
  const float* xa = nullptr;  // arranged x: rows x kp floats
  std::int64_t rows = 0, in = 0, kp = 0;
  const std::uint8_t* w = nullptr;  // row 0 of the weight, [out][in] in dtype
  std::size_t row_bytes = 0;
  DType dtype = DType::f32;
  float* y = nullptr;
  std::int64_t ldy = 0;
};

// Each computes output features [n0, n1) of every row. The AVX-512 one needs AVX-512 F, BW, VL and DQ.
void gemm_scalar(const GemmArgs& a, std::int64_t n0, std::int64_t n1);
void gemm_avx2(const GemmArgs& a, std::int64_t n0, std::int64_t n1);
void gemm_avx512(const GemmArgs& a, std::int64_t n0, std::int64_t n1);

// The last (partial) block of a weight row, widened into the block's lane order: lo[j] and hi[j] are the
// weights paired with arranged x[32b + j] and x[32b + 16 + j]; elements past `in` are zero.
void tail_weights(const std::uint8_t* row, DType dt, std::int64_t block_start, std::int64_t in, float* lo, float* hi);

}  // namespace kvfleet::cpu::detail
