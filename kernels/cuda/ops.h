// The CUDA kernels, one op per .cu file, each tested against its CPU reference in kernels/cpu (tests/cuda).
// Plain C++ declarations so the backend (a .cpp) can call them. Every launcher runs on `stream`, checks
// its launch and throws std::runtime_error naming the kernel.
//
// Batch invariance: as on the CPU, every output element is reduced in an order fixed by its own inputs
// (a row's dot products, a head's context split at fixed 256-token boundaries), never by the batch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvfleet/dtype.h"

namespace kvfleet::cuda {

struct WeightRef {
  const void* data = nullptr;  // null: absent
  DType dtype = DType::f32;
};

// One layer of the paged KV cache in device memory (docs/architecture.md, Contract 5): per block, K then V, each
// [num_kv_heads][block_size][head_dim], elements of `dtype` (f32 or bf16).
struct KvLayer {
  void* base = nullptr;
  DType dtype = DType::f32;
  std::int64_t block_size = 16, num_kv_heads = 0, head_dim = 0;
  constexpr std::int64_t block_elems() const { return 2 * num_kv_heads * block_size * head_dim; }
};

// out[i][:] = table[ids[i]][:]  (embedding.cu)
void embedding(WeightRef table, std::int64_t dim, const std::int32_t* ids, std::int64_t n, float* out,
               cudaStream_t stream);

// out = x / sqrt(mean(x^2) + eps) * w; add_rms_norm first does residual += delta.  (rms_norm.cu)
void rms_norm(const float* x, std::int64_t rows, std::int64_t dim, WeightRef w, float eps, float* out,
              cudaStream_t stream);
void add_rms_norm(float* residual, const float* delta, std::int64_t rows, std::int64_t dim, WeightRef w, float eps,
                  float* out, cudaStream_t stream);

// y[t][n] = x[t] . w[n] + bias[n], w [out][in] in its checkpoint dtype, fp32 accumulation in a fixed
// order per output element: batch-invariant.  (linear.cu)
void linear(const float* x, std::int64_t rows, std::int64_t in, WeightRef w, std::int64_t out, WeightRef bias, float* y,
            cudaStream_t stream);
// y[t][n] += bias[n]  (linear.cu; the cuBLAS path's epilogue)
void add_bias(float* y, std::int64_t rows, std::int64_t out, WeightRef bias, cudaStream_t stream);

// Element-wise conversions (convert.cu): fp32 -> bf16/f16 (round to nearest even), and any -> fp32.
void f32_to_half(const float* x, std::int64_t n, DType to, void* out, cudaStream_t stream);
void to_f32(const void* x, DType from, std::int64_t n, float* out, cudaStream_t stream);

// gate = silu(gate) * up  (silu_mul.cu)
void silu_mul(float* gate, const float* up, std::int64_t n, cudaStream_t stream);

// Rotates q [rows][num_heads][head_dim] in place and k by position (HF rotate_half), and writes k and v
// ([rows][num_kv_heads][head_dim]) into each row's cache slot.  (rope_store_kv.cu)
void rope_store_kv(const float* inv_freq, float* q, const float* k, const float* v, std::int64_t rows,
                   std::int64_t num_heads, const std::int32_t* positions, const std::int64_t* slots, KvLayer cache,
                   cudaStream_t stream);

// Attention of every query row over its sequence's keys [0, position] through its block table, GQA-aware.
// The context is cut into fixed 256-token partitions, each attended by one block (online softmax in
// fp32), then a reduce step merges the partitions in order.  (paged_attention.cu)
struct AttentionArgs {
  const float* q = nullptr;  // [rows][num_heads][head_dim]
  std::int64_t rows = 0, num_heads = 0;
  const std::int32_t* positions = nullptr;
  const std::int32_t* table_offsets = nullptr;
  const std::int32_t* tables = nullptr;
  std::int32_t max_position = 0;  // max over positions: sizes the grid
  float scale = 1.0f;
  float* out = nullptr;  // [rows][num_heads][head_dim]
};
std::size_t paged_attention_workspace_bytes(std::int64_t rows, std::int64_t num_heads, std::int64_t head_dim,
                                            std::int32_t max_position);
void paged_attention(const AttentionArgs& a, KvLayer cache, void* workspace, cudaStream_t stream);

// The same attention on tensor cores, flash-attention style, for prefill-heavy steps (prefill_attention.cu).
// Needs a bf16 cache and head_dim % 16 == 0 (<= 256). Not batch-invariant: a row's sums depend on which
// rows share its 16-row tile, so the backend uses it only with batch_invariant off.
bool prefill_attention_supported(const KvLayer& cache);
void prefill_attention(const AttentionArgs& a, KvLayer cache, cudaStream_t stream);

// out[r] = argmax of logits row r (ties: the lowest id), as sample() does at temperature 0.  (argmax.cu)
void argmax_rows(const float* logits, std::int64_t rows, std::int64_t vocab, std::int32_t* out, cudaStream_t stream);

// Sampling with the semantics of kvfleet::sample(): one row of parameters per logits row.  (sampling.cu)
struct SampleRow {
  float temperature = 1.0f;  // 0: greedy
  std::int32_t top_k = 0;    // 0 or -1: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  std::uint64_t seed = 0, draw_index = 0;
};
std::size_t sample_workspace_bytes(std::int64_t rows, std::int64_t vocab);
void sample_rows(const float* logits, std::int64_t rows, std::int64_t vocab, const SampleRow* d_rows, void* workspace,
                 std::int32_t* out, cudaStream_t stream);

}  // namespace kvfleet::cuda
