// Paged attention for decode and prefill rows alike (CPU reference: kernels/cpu/paged_attention.cpp).
// Each row attends to positions [0, position] of its own sequence, so the causal mask and a cached
// prefix need nothing special. The context is cut at fixed multiples of kPart tokens; one block per
// (partition, head, row) computes scores into shared memory, their max and exp-sum, and the unnormalised
// weighted sum of V; a second kernel merges the partitions in order (the split-K "reduce" step). Because
// the cuts depend only on the position, a row's result never depends on the batch or on chunking.
// The batch-invariant path, and decode's: prefill rows re-read K/V per row. prefill_attention.cu is the
// tensor-core (flash) kernel the fast mode uses for prefill-heavy steps.
#include <algorithm>
#include <cfloat>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

constexpr int kPart = 256;     // context tokens per partition
constexpr int kThreads = 128;  // 4 warps
constexpr int kMaxHeadDim = 256;

struct Workspace {
  float* acc;  // [rows][heads][parts][head_dim] unnormalised sum of p * V
  float* ml;   // [rows][heads][parts][2] max score, sum of exp(score - max)
};

Workspace carve(void* ws, std::int64_t rows, std::int64_t heads, std::int64_t parts, std::int64_t head_dim) {
  auto* acc = static_cast<float*>(ws);
  return {acc, acc + rows * heads * parts * head_dim};
}

__device__ float block_reduce_sum(float v, float* shared) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) total += shared[i];  // same order in every thread
  __syncthreads();
  return total;
}

__device__ float block_reduce_max(float v, float* shared) {
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float m = -FLT_MAX;
  for (int i = 0; i < kThreads / 32; ++i) m = fmaxf(m, shared[i]);
  __syncthreads();
  return m;
}

template <typename KV>
__global__ void __launch_bounds__(kThreads)
    attention_part_kernel(AttentionArgs a, KvLayer c, std::int64_t parts, Workspace ws) {
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float p_s[kPart];
  __shared__ float red[kThreads / 32];
  const std::int64_t part = blockIdx.x, head = blockIdx.y, row = blockIdx.z, d_n = c.head_dim;
  const std::int32_t pos = a.positions[row];
  const std::int64_t start = part * kPart;
  if (start > pos) return;  // past this row's context: the reduce step never reads it
  const int n = static_cast<int>(pos + 1 - start < kPart ? pos + 1 - start : kPart);
  const std::int64_t kv_head = head / (a.num_heads / c.num_kv_heads);
  const std::int32_t* table = a.tables + a.table_offsets[row];
  const KV* base = static_cast<const KV*>(c.base);
  const std::int64_t head_stride = c.block_size * d_n, v_offset = c.num_kv_heads * head_stride;
  auto key = [&](std::int64_t j) {
    return base + table[j / c.block_size] * c.block_elems() + kv_head * head_stride + (j % c.block_size) * d_n;
  };
  for (std::int64_t d = threadIdx.x; d < d_n; d += kThreads) q_s[d] = a.q[(row * a.num_heads + head) * d_n + d];
  __syncthreads();
  // Scores: a warp per token, lanes split the head dimension.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = warp; t < n; t += kThreads / 32) {
    const KV* k = key(start + t);
    float s = 0.0f;
    for (std::int64_t d = lane; d < d_n; d += 32) s += q_s[d] * to_float(k[d]);
    s = warp_sum(s);
    if (lane == 0) p_s[t] = s * a.scale;
  }
  __syncthreads();
  float m = -FLT_MAX;
  for (int t = threadIdx.x; t < n; t += kThreads) m = fmaxf(m, p_s[t]);
  m = block_reduce_max(m, red);
  float l = 0.0f;
  for (int t = threadIdx.x; t < n; t += kThreads) l += (p_s[t] = expf(p_s[t] - m));
  l = block_reduce_sum(l, red);  // also orders the p_s writes before the reads below
  const std::int64_t slot = (row * a.num_heads + head) * parts + part;
  for (std::int64_t d = threadIdx.x; d < d_n; d += kThreads) {
    float acc = 0.0f;
    for (int t = 0; t < n; ++t) acc += p_s[t] * to_float(key(start + t)[v_offset + d]);
    ws.acc[slot * d_n + d] = acc;
  }
  if (threadIdx.x == 0) {
    ws.ml[slot * 2] = m;
    ws.ml[slot * 2 + 1] = l;
  }
}

__global__ void attention_reduce_kernel(AttentionArgs a, std::int64_t head_dim, std::int64_t parts, Workspace ws) {
  const std::int64_t head = blockIdx.x, row = blockIdx.y;
  const std::int64_t used = a.positions[row] / kPart + 1;
  const std::int64_t first = (row * a.num_heads + head) * parts;
  float m = -FLT_MAX;
  for (std::int64_t p = 0; p < used; ++p) m = fmaxf(m, ws.ml[(first + p) * 2]);
  float l = 0.0f;
  for (std::int64_t p = 0; p < used; ++p) l += expf(ws.ml[(first + p) * 2] - m) * ws.ml[(first + p) * 2 + 1];
  for (std::int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t p = 0; p < used; ++p)
      acc += expf(ws.ml[(first + p) * 2] - m) * ws.acc[(first + p) * head_dim + d];
    a.out[(row * a.num_heads + head) * head_dim + d] = acc / l;
  }
}

std::int64_t parts_for(std::int32_t max_position) { return max_position / kPart + 1; }

}  // namespace

std::size_t paged_attention_workspace_bytes(std::int64_t rows, std::int64_t num_heads, std::int64_t head_dim,
                                            std::int32_t max_position) {
  const auto slots = static_cast<std::size_t>(rows * num_heads * parts_for(max_position));
  return slots * static_cast<std::size_t>(head_dim + 2) * sizeof(float);
}

void paged_attention(const AttentionArgs& a, KvLayer cache, void* workspace, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (cache.head_dim > kMaxHeadDim) throw std::invalid_argument("paged_attention: head_dim above 256");
  if (a.num_heads % cache.num_kv_heads != 0)
    throw std::invalid_argument("paged_attention: num_heads must be a multiple of num_kv_heads");
  if (a.rows > 65535 || a.num_heads > 65535) throw std::invalid_argument("paged_attention: grid too large");
  const std::int64_t parts = parts_for(a.max_position);
  const Workspace ws = carve(workspace, a.rows, a.num_heads, parts, cache.head_dim);
  const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.rows));
  switch (cache.dtype) {
    case DType::f32:
      attention_part_kernel<float><<<grid, kThreads, 0, stream>>>(a, cache, parts, ws);
      break;
    case DType::bf16:
      attention_part_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a, cache, parts, ws);
      break;
    case DType::f16:
      throw std::invalid_argument("paged_attention: the KV cache is f32 or bf16");
  }
  check_launch("attention_part_kernel");
  const dim3 reduce_grid(static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.rows));
  attention_reduce_kernel<<<reduce_grid, 128, 0, stream>>>(a, cache.head_dim, parts, ws);
  check_launch("attention_reduce_kernel");
}

}  // namespace kvfleet::cuda
