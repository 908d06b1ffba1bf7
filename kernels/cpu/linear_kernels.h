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
// tile it falls in or the thread that runs it (batch invariance, docs/architecture.md).
//
// Weights come in two layouts with the same arithmetic (only the addresses differ):
//   - plain: [out][in] rows, as in the checkpoint; the last block of a row is partial (tail).
//   - packed (pack_weight, ops.h): panels of kPanel features; a panel holds, block by block, the 32
//     elements of each of its kPanel features (zero-padded to kp), so a tile's weights are one contiguous
//     stream and there is no tail. Features past `out` in the last panel are zero.
// The optional AVX-512 BF16 mode (Isa::avx512bf16, cpu_isa.h) is the one exception to the arithmetic
// above: see linear_avx512bf16.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvfleet/dtype.h"

namespace kvfleet::cpu::detail {

constexpr std::int64_t kBlock = 32;  // reduction elements per block
constexpr std::int64_t kLanes = 16;
constexpr std::int64_t kPanel = 8;  // features per packed panel (also the unit of the thread split)

inline std::int64_t arranged_len(std::int64_t in) { return (in + kBlock - 1) / kBlock * kBlock; }

// One call's operands: y[t * ldy + n] = sum_k x[t][k] * w[n][k] for t < rows and n in the caller's range.
// Feature n's block starting at element b (a multiple of 32) is at
//   w + (n / kPanel) * panel_bytes + (n % kPanel) * feature_bytes + (b / kBlock) * block_step
// (plain: panel_bytes = kPanel * row bytes, feature_bytes = row bytes, block_step = 32 elements;
//  packed: panel_bytes = kPanel * kp elements, feature_bytes = 32 elements, block_step = kPanel * 32).
// Blocks below `full` are complete; the one at `full` (plain layout only) is the row's tail.
struct GemmArgs {
  const float* xa = nullptr;  // arranged x: rows x kp floats (gemm_avx512: in arrange_tiled's order)
  std::int64_t rows = 0, in = 0, kp = 0, full = 0;
  const std::uint8_t* w = nullptr;
  std::size_t panel_bytes = 0, feature_bytes = 0, block_step = 0;
  DType dtype = DType::f32;
  bool packed = false;  // pack_weight's layout (set_layout)
  float* y = nullptr;
  std::int64_t ldy = 0;
};

// Whether cpu::linear cuts calls of few rows into tapered chunks (linear.cpp; default on, KVFLEET_CPU_TAPER=0
// off): for benchmarks that compare both in one process. Never changes a bit.
void set_tapered_split(bool on);
// The weight bytes a tapered call's last chunks hold (default 96 KiB), for benchmarks. Never changes a bit.
void set_taper_tail_bytes(std::int64_t bytes);
std::int64_t taper_tail_bytes();

// How far ahead the AVX-512 tiles on packed panels prefetch, in blocks (default 8 into L1, 32 into L2;
// 0: none): for benchmarks that compare distances in one process. Never changes a bit.
void set_packed_prefetch(std::uint32_t l1_blocks, std::uint32_t l2_blocks);

// How the AVX-512 GEMV (one row) reads packed panels: streams 0 = like every tile (8 pointers, the prefetch
// of set_packed_prefetch), 1 or 2 = a panel at a time, one or two panels side by side, prefetching l1 / l2
// blocks ahead (0: none). Chosen once per process from KVFLEET_CPU_GEMV (tile, 1, 2) or the CPU
// (linear_avx512.cpp); settable for benchmarks that compare in one process. Never changes a bit.
void set_packed_gemv(std::uint32_t streams, std::uint32_t l1_blocks, std::uint32_t l2_blocks);
void packed_gemv(std::uint32_t& streams, std::uint32_t& l1_blocks, std::uint32_t& l2_blocks);

// The AVX2 GEMV (one row, packed panels: linear_avx2.cpp): the first of a panel's two passes prefetches
// `ahead_blocks` blocks ahead (default 0: the current block's lines, the fastest on Zen 3); a negative value selects the 2 x 2
// tile instead. Chosen once per process from KVFLEET_CPU_GEMV_AVX2 (tile |
// blocks); settable for benchmarks that compare in one process; avx2_gemv() says which (-1: the tile).
// Never changes a bit.
void set_avx2_gemv(int ahead_blocks);
int avx2_gemv();
// The AVX2 kernel's rows > 1 (KVFLEET_CPU_GEMM_AVX2): 0 one 2 x 2 tile over the whole weight (`tile`),
// 1 3 x 2 tiles in row blocks and feature chunks at every row count (`3x2`), 2 (default)
// the same with segmented 3 x 3 tiles from 16 rows on (linear_avx2.cpp). For benchmarks. Never changes a bit.
void set_avx2_gemm(int mode);

// Fills the layout fields of g for a weight of `dtype` with `in` columns, plain or packed.
void set_layout(GemmArgs& g, DType dtype, bool packed);

// Each computes output features [n0, n1) of every row. The AVX-512 one needs AVX-512 F, BW, VL and DQ;
// the BF16 one also AVX-512 BF16, bf16 weights and x arranged by arrange_bf16 (kp / 2 32-bit pairs a row).
void gemm_scalar(const GemmArgs& a, std::int64_t n0, std::int64_t n1);
void gemm_avx2(const GemmArgs& a, std::int64_t n0, std::int64_t n1);
void gemm_avx512(const GemmArgs& a, std::int64_t n0, std::int64_t n1);
void gemm_avx512bf16(const GemmArgs& a, std::int64_t n0, std::int64_t n1);
// x in the AVX-512 kernel's row tiles (the same values and lane order as arranged x, other addresses):
// rows split into tiles of at most 6 (as evenly as possible, linear_avx512.cpp); a tile of M rows from row
// t0 starts at xa + t0 * kp and holds, block by block, the 32 arranged floats of each of its M rows, so
// the M x vectors of a block are one contiguous range (a single pointer, constant offsets). One row is
// plain arranged x.
void arrange_tiled(const float* x, std::int64_t rows, std::int64_t in, std::int64_t kp, DType dt, float* xa);
// x rows rounded to bf16 (nearest even, as f32_to_bf16), element k of a row at position k, zero-padded to kp,
// in the BF16 mode's row tiles (as arrange_tiled's, in bf16): the BF16 mode's operand. Needs AVX-512 BF16's CPU.
void arrange_bf16(const float* x, std::int64_t rows, std::int64_t in, std::int64_t kp, float* xa);

// A block of a weight row (`blk` points at its first element) widened into the block's lane order: lo[j]
// and hi[j] are the weights paired with arranged x[32b + j] and x[32b + 16 + j]; elements from `valid` on
// are zero (the tail of a plain row).
void block_weights(const std::uint8_t* blk, DType dt, std::int64_t valid, float* lo, float* hi);

}  // namespace kvfleet::cpu::detail
