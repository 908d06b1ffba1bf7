// The CUDA mixture-of-experts kernels (CPU references: kernels/cpu/moe.h). Plain C++ declarations for the
// backend; every launcher runs on `stream`, checks its launch and throws std::runtime_error naming it.
//
// The path of one MoE layer: moe_route (softmax + top-k per row) -> moe_align (group the rows * k
// (row, rank) pairs by expert, rows ascending within an expert) -> moe_grouped_linear for gate and up
// (one launch each over all experts: the grouped GEMM) -> silu_mul -> moe_grouped_linear for down ->
// moe_combine (unpermute: each row sums its k expert outputs weighted, in rank order). Every output
// element is reduced in an order fixed by its own inputs, so the path is batch-invariant like the CPU's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvfleet/dtype.h"

namespace kvfleet::cuda {

constexpr std::int64_t kMaxExperts = 512;  // moe_route keeps a row's probabilities in registers

// ids[r][j], weights[r][j]: the top_k experts of row r by softmax(logits[r]) (descending, ties to the
// lower id), renormalised to sum 1 when asked. One warp per row.  (moe_route.cu)
void moe_route(const float* logits, std::int64_t rows, std::int64_t num_experts, std::int64_t top_k, bool renormalize,
               std::int32_t* ids, float* weights, cudaStream_t stream);

// Groups the pairs by expert: offsets[e] .. offsets[e + 1] are expert e's slots, position[pair] is a
// pair's slot and source[slot] its row (pair / top_k). counts (may be null): += pairs per expert.  (moe_align.cu)
void moe_align(const std::int32_t* ids, std::int64_t pairs, std::int64_t top_k, std::int64_t num_experts,
               std::int32_t* offsets, std::int32_t* position, std::int32_t* source, std::int32_t* counts,
               cudaStream_t stream);

// y[slot] = x[source ? source[slot] : slot] . W_e^T for the expert e owning the slot; weights is a device
// array of num_experts pointers to [out][in] matrices of `dtype`. The reduction order is linear.cu's.
// (moe_grouped_linear.cu)
void moe_grouped_linear(const float* x, const std::int32_t* source, std::int64_t slots, std::int64_t in,
                        const void* const* weights, DType dtype, std::int64_t num_experts, const std::int32_t* offsets,
                        std::int64_t out, float* y, cudaStream_t stream);

// out[r][:] = sum over j < top_k, in order, of weights[r][j] * ys[position[r * top_k + j]][:].  (moe_combine.cu)
void moe_combine(const float* ys, const std::int32_t* position, const float* weights, std::int64_t rows,
                 std::int64_t top_k, std::int64_t hidden, float* out, cudaStream_t stream);

// acc[r][:] += sigmoid(gate[r]) * x[r][:]  (moe_combine.cu; Qwen2-MoE's shared expert)
void sigmoid_scale_add(float* acc, const float* x, const float* gate, std::int64_t rows, std::int64_t dim,
                       cudaStream_t stream);

// out[i][:] = x[rows[i]][:] for i < n (expert parallelism: the rows a rank sends, in dispatch order).
// (moe_gather.cu)
void gather_rows(const float* x, const std::int32_t* rows, std::int64_t n, std::int64_t dim, float* out,
                 cudaStream_t stream);

}  // namespace kvfleet::cuda
