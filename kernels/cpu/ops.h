// The CPU kernels: the reference every other backend is tested against, and the CPU backend itself.
// Activations are fp32; weights are read in their checkpoint dtype and widened on the fly.
//
// Batch invariance: every output element is computed by one thread, in a fixed order that depends only
// on that element's own inputs. So a sequence's results do not depend on what else is in the batch,
// how its prompt was chunked, or how many threads run (docs/architecture.md, Contract 5; tests/runtime/test_equivalence.cpp).
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kvfleet/dtype.h"

namespace kvfleet::cpu {

// A weight or bias in its checkpoint dtype (data == nullptr: absent).
struct WeightRef {
  const void* data = nullptr;
  DType dtype = DType::f32;
  // linear and linear_multi only: the same weight in pack_weight's layout, or null. When set, every row
  // count reads it and `data` is never touched (the CPU backend keeps the packed copy as the only one it
  // reads): the GEMM's tiles read one contiguous stream, the GEMV (one row) one stream per 8 features,
  // prefetched far ahead (linear_avx512.cpp). Same bits either way.
  const void* packed = nullptr;
};

// y[t][n] = sum_k x[t][k] * w[n][k] + bias[n] for t < rows, n < out; w is [out][in] (PyTorch layout).
void linear(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, WeightRef w, std::int64_t out,
            WeightRef bias, float* y);

// A [out][in] weight re-arranged for linear (linear_kernels.h): panels of 8 output features, each panel
// block by block (32 elements of each of its features side by side), zero-padded, so that a tile streams
// one contiguous range and a thread's share of the features is one contiguous range. The results are the
// same bits as with the plain weight. pack_weight writes packed_weight_bytes(...) bytes to dst, split
// over the pool when one is given.
std::size_t packed_weight_bytes(std::int64_t out, std::int64_t in, DType dtype);
void pack_weight(const void* w, DType dtype, std::int64_t out, std::int64_t in, void* dst, ThreadPool* pool = nullptr);

// One output of a linear_multi: y[t][n] = sum_k x[t][k] * w[n][k] + bias[n], y is [rows][out].
struct LinearPart {
  WeightRef w;
  std::int64_t out = 0;
  WeightRef bias;
  float* y = nullptr;
};

// Several projections of the same x (Q/K/V, gate/up) as one op: one arrangement of x and one hand-off to
// the pool for all their output features. Each part's results are bit-identical to its own linear().
void linear_multi(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, const LinearPart* parts,
                  std::int64_t num_parts);

// Dot product of fp32 x with one weight row, in the fixed order every kernel uses (linear_kernels.h).
float dot(const float* x, WeightRef w_row, std::int64_t n);

// out[i][:] = table[ids[i]][:]
void embedding(WeightRef table, std::int64_t dim, const std::int32_t* ids, std::int64_t n, float* out);

// out = x / sqrt(mean(x^2) + eps) * w, row by row.
void rms_norm(const float* x, std::int64_t rows, std::int64_t dim, WeightRef w, float eps, float* out);

// residual += delta; out = rms_norm(residual). The transformer block's "add & norm".
void add_rms_norm(float* residual, const float* delta, std::int64_t rows, std::int64_t dim, WeightRef w, float eps,
                  float* out);

// gate[i] = silu(gate[i]) * up[i]
void silu_mul(float* gate, const float* up, std::int64_t n);

// The same ops split over the pool by rows (silu_mul: by elements) where the work is worth a hand-off
// (prefill, large batches; a decode row stays on the caller). Each row computes exactly what the serial
// op computes, so the bits do not depend on the split or the thread count.
void rms_norm(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t dim, WeightRef w, float eps, float* out);
void add_rms_norm(ThreadPool& pool, float* residual, const float* delta, std::int64_t rows, std::int64_t dim,
                  WeightRef w, float eps, float* out);
void silu_mul(ThreadPool& pool, float* gate, const float* up, std::int64_t n);

// Rotary embedding parameters (HF "rotate_half" convention): inv_freq[i] for i < head_dim / 2, after any
// rope scaling.
struct Rope {
  const float* inv_freq = nullptr;
  std::int64_t head_dim = 0;
};

// One layer of the paged KV cache (docs/architecture.md, Contract 5): per block, K then V, each
// [num_kv_heads][block_size][head_dim], elements of `dtype` (fp32, bf16 or fp16: --kv-cache-dtype).
struct KvLayer {
  void* base = nullptr;
  DType dtype = DType::f32;
  std::int64_t block_size = 16;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t block_elems() const { return 2 * num_kv_heads * block_size * head_dim; }
  // Element offsets from base of K and V of (block, kv head, slot).
  std::int64_t k_offset(std::int64_t block, std::int64_t head, std::int64_t slot) const {
    return block * block_elems() + (head * block_size + slot) * head_dim;
  }
  std::int64_t v_offset(std::int64_t block, std::int64_t head, std::int64_t slot) const {
    return k_offset(block, head, slot) + num_kv_heads * block_size * head_dim;
  }
  template <class T>
  T* at(std::int64_t offset) const {
    return static_cast<T*>(base) + offset;
  }

  // Optional (the CPU backend keeps one; a kernel test may not): K again, transposed for decode attention,
  // which otherwise transposes every block it reads on every step. Per block and kv head, the block's
  // keys in groups of 16 ([group][head_dim][16 keys], block_size rounded up to 16), elements of `dtype`.
  // K stays the authority: kt_fresh[block] is 1 while the copy matches K (rope_store_kv writes both),
  // 0 after K was written another way (a transfer into the block: the backend clears it);
  // paged_attention transposes a block that is not fresh again before it reads the copy.
  void* kt = nullptr;
  std::uint8_t* kt_fresh = nullptr;
  static constexpr std::int64_t kKtKeys = 16;  // keys per transposed group (attention_kernels.h's kAttnKeys)
  std::int64_t kt_head_elems() const { return (block_size + kKtKeys - 1) / kKtKeys * kKtKeys * head_dim; }
  std::int64_t kt_block_elems() const { return num_kv_heads * kt_head_elems(); }
  std::int64_t kt_offset(std::int64_t block, std::int64_t head) const {
    return block * kt_block_elems() + head * kt_head_elems();
  }
  // Element i of slot `slot`'s key in its head's copy: lane slot % 16 of group slot / 16, row i.
  std::int64_t kt_slot_offset(std::int64_t slot, std::int64_t i) const {
    return (slot / kKtKeys * head_dim + i) * kKtKeys + slot % kKtKeys;
  }
  template <class T>
  T* kt_at(std::int64_t offset) const {
    return static_cast<T*>(kt) + offset;
  }
};

// Rotates q [rows][num_heads][head_dim] in place and k by position, then writes k and v
// ([rows][num_kv_heads][head_dim]) into the cache slot of each row (slot = block * block_size + offset),
// and k into the transposed copy too where the cache has one (KvLayer::kt).
void rope_store_kv(const Rope& rope, float* q, const float* k, const float* v, std::int64_t rows,
                   std::int64_t num_heads, const std::int32_t* positions, const std::int64_t* slots, KvLayer cache);
// The same, rows split over the pool (each row writes its own slot: rows never share one).
void rope_store_kv(ThreadPool& pool, const Rope& rope, float* q, const float* k, const float* v, std::int64_t rows,
                   std::int64_t num_heads, const std::int32_t* positions, const std::int64_t* slots, KvLayer cache);

// What one query row attends to: positions [0, position] of its sequence, found through its block table.
struct AttnRow {
  std::int32_t position = 0;
  const std::int32_t* block_table = nullptr;
};

// out[r][h][:] = softmax(q[r][h] . K[0..position] * scale) . V, with GQA (head h reads kv head
// h / (num_heads / num_kv_heads)). Each K/V block is read once per kv head for all the query heads of its
// group and, in prefill, for a tile of consecutive rows of one sequence; softmax is online, block by block
// in absolute key positions, so a row's result does not depend on the tile, the batch or the chunking.
// (paged_attention.cpp; attention_reference below is the plain two-pass version it is tested against.)
void paged_attention(ThreadPool& pool, const float* q, std::int64_t rows, std::int64_t num_heads,
                     const AttnRow* row_info, KvLayer cache, float scale, float* out);

// The same result by the textbook route (scores, max, exp, weighted sum; one head at a time, single
// thread), in double: what tests compare paged_attention with.
void attention_reference(const float* q, std::int64_t rows, std::int64_t num_heads, const AttnRow* row_info,
                         KvLayer cache, float scale, float* out);

}  // namespace kvfleet::cpu
