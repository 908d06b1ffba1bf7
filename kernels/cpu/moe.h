// Mixture-of-experts kernels: routing (softmax + top-k) and the expert MLPs over tokens grouped by expert.
// CPU references for kernels/cuda/moe_*.cu and the CPU backend's MoE path.
//
// Batch invariance, as for the dense kernels: a row's result depends only on that row. Routing works row
// by row; each expert's GEMMs go through cpu::linear, whose output elements do not depend on the other
// rows; and the k expert outputs of a row are summed in top-k rank order (rank 0 = most probable, ties to
// the lower expert id), starting from zero. So neither the batch, nor how tokens spread over experts, nor
// (with expert parallelism) which rank computed an expert changes a row's bits.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {

// Per row: p = softmax(logits[r]) in fp32 (max subtracted), the top_k largest p in descending order (equal
// values: lower expert id first) into ids[r][0..k) and weights[r][0..k), divided by their sum when
// `renormalize` (norm_topk_prob; Mixtral always).
void moe_route(const float* logits, std::int64_t rows, std::int64_t num_experts, std::int64_t top_k,
               bool renormalize, std::int32_t* ids, float* weights);

struct ExpertRef {
  WeightRef gate, up, down;  // [I][H], [I][H], [H][I]
};

// Reusable buffers for moe_experts (grown as needed, never shrunk).
struct MoeScratch {
  std::vector<std::int32_t> offsets, order;
  std::vector<float> xs, gate, up, ys;
};

// out[r] = sum over j < top_k, in order, of weights[r][j] * expert_{ids[r][j]}(x[r]), where
// expert(x) = down(silu(gate(x)) * up(x)). Tokens are grouped by expert (counting sort, rows ascending
// within an expert) and each expert's three GEMMs run once over its tokens. counts (may be null) gets
// += the number of rows routed to each expert.
void moe_experts(ThreadPool& pool, MoeScratch& scratch, const float* x, std::int64_t rows, std::int64_t hidden,
                 std::int64_t intermediate, const std::int32_t* ids, const float* weights, std::int64_t top_k,
                 const ExpertRef* experts, std::int64_t num_experts, float* out, std::int32_t* counts);

// out[r][:] = sum over j < top_k, in order, of weights[r][j] * ys[position[r * top_k + j]][:]: the combine
// (unpermute) step of moe_experts, shared with expert parallelism's combine.
void moe_combine(const float* ys, const std::int32_t* position, const float* weights, std::int64_t rows,
                 std::int64_t top_k, std::int64_t hidden, float* out);

// acc[r][:] += sigmoid(gate[r]) * x[r][:] (Qwen2-MoE's shared expert, gated per token).
void sigmoid_scale_add(float* acc, const float* x, const float* gate, std::int64_t rows, std::int64_t dim);

}  // namespace kvfleet::cpu
