// Prefill attention on tensor cores (WMMA, bf16 in, fp32 accumulate), flash-attention style: a block takes
// 16 consecutive query rows of one head, walks the keys in 32-token tiles read through the block table,
// and keeps a running max, sum and output per row (online softmax), so no score matrix is materialised.
// Causal mask and cached prefix come from the positions: row i attends keys [0, position_i]. Rows of
// several sequences in one tile (a chunk boundary) are handled one sequence at a time, the others masked.
// CPU reference: kernels/cpu/paged_attention.cpp. bf16 KV cache, head_dim a multiple of 16 up to 256.
// Not batch-invariant (a row's sums depend on its tile): the backend uses it only with batch_invariant off.
#include <mma.h>

#include <cfloat>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

using namespace nvcuda;

constexpr int kRowsTile = 16, kKeysTile = 32, kThreads = 128, kThreadsPerRow = kThreads / kRowsTile;

struct Smem {  // offsets into dynamic shared memory for head_dim d
  std::size_t q, k, v, s, p, o, pv, total;
  explicit __host__ __device__ Smem(std::int64_t d) {
    const auto D = static_cast<std::size_t>(d);
    q = 0;
    k = q + kRowsTile * D * 2;
    v = k + kKeysTile * D * 2;
    s = v + kKeysTile * D * 2;
    p = s + kRowsTile * kKeysTile * 4;
    o = p + kRowsTile * kKeysTile * 2;
    pv = o + kRowsTile * D * 4;
    total = pv + kRowsTile * D * 4;
  }
};

__global__ void __launch_bounds__(kThreads) prefill_attention_kernel(AttentionArgs a, KvLayer c) {
  extern __shared__ __align__(128) unsigned char smem[];
  const std::int64_t D = c.head_dim;
  const Smem L(D);
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem + L.q);
  auto* k_s = reinterpret_cast<__nv_bfloat16*>(smem + L.k);
  auto* v_s = reinterpret_cast<__nv_bfloat16*>(smem + L.v);
  auto* s_s = reinterpret_cast<float*>(smem + L.s);
  auto* p_s = reinterpret_cast<__nv_bfloat16*>(smem + L.p);
  auto* o_s = reinterpret_cast<float*>(smem + L.o);
  auto* pv_s = reinterpret_cast<float*>(smem + L.pv);
  __shared__ float m_s[kRowsTile], l_s[kRowsTile];
  __shared__ std::int32_t pos_s[kRowsTile], seq_s[kRowsTile];  // seq: table offset; -1 done or absent
  __shared__ std::int32_t current, max_pos;

  const std::int64_t r0 = blockIdx.x * static_cast<std::int64_t>(kRowsTile), head = blockIdx.y;
  const std::int64_t kv_head = head / (a.num_heads / c.num_kv_heads);
  const int warp = threadIdx.x / 32, my_row = threadIdx.x / kThreadsPerRow, sub = threadIdx.x % kThreadsPerRow;
  if (threadIdx.x < kRowsTile) {
    const std::int64_t r = r0 + threadIdx.x;
    pos_s[threadIdx.x] = r < a.rows ? a.positions[r] : -1;
    seq_s[threadIdx.x] = r < a.rows ? a.table_offsets[r] : -1;
  }
  for (std::int64_t i = threadIdx.x; i < kRowsTile * D; i += kThreads) {
    const std::int64_t r = r0 + i / D;
    q_s[i] = __float2bfloat16_rn(r < a.rows ? a.q[(r * a.num_heads + head) * D + i % D] : 0.0f);
  }
  const auto* cache = static_cast<const __nv_bfloat16*>(c.base);
  const std::int64_t head_stride = c.block_size * D, v_offset = c.num_kv_heads * head_stride;
  for (;;) {
    __syncthreads();
    if (threadIdx.x == 0) {  // the next sequence of this tile, and how far its rows reach
      current = -1;
      max_pos = -1;
      for (int i = 0; i < kRowsTile; ++i)
        if (seq_s[i] >= 0 && (current < 0 || seq_s[i] == current)) {
          current = seq_s[i];
          max_pos = max(max_pos, pos_s[i]);
        }
    }
    __syncthreads();
    if (current < 0) return;
    const std::int32_t* table = a.tables + current;
    const bool row_active = seq_s[my_row] == current;
    if (sub == 0) {
      m_s[my_row] = -FLT_MAX;
      l_s[my_row] = 0.0f;
    }
    for (std::int64_t d = sub; d < D; d += kThreadsPerRow) o_s[my_row * D + d] = 0.0f;
    for (std::int64_t t0 = 0; t0 <= max_pos; t0 += kKeysTile) {
      __syncthreads();
      for (std::int64_t i = threadIdx.x; i < kKeysTile * D; i += kThreads) {  // K and V tiles via the table
        const std::int64_t j = t0 + i / D, d = i % D;
        __nv_bfloat16 kv = __float2bfloat16_rn(0.0f), vv = kv;
        if (j <= max_pos) {
          const __nv_bfloat16* src =
              cache + table[j / c.block_size] * c.block_elems() + kv_head * head_stride + (j % c.block_size) * D + d;
          kv = src[0];
          vv = src[v_offset];
        }
        k_s[i] = kv;
        v_s[i] = vv;
      }
      __syncthreads();
      if (warp < kKeysTile / 16) {  // S = Q K^T: one 16x16 tile per warp
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        for (std::int64_t k = 0; k < D; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;
          wmma::load_matrix_sync(qa, q_s + k, static_cast<unsigned>(D));
          wmma::load_matrix_sync(kb, k_s + warp * 16 * D + k, static_cast<unsigned>(D));
          wmma::mma_sync(acc, qa, kb, acc);
        }
        wmma::store_matrix_sync(s_s + warp * 16, acc, kKeysTile, wmma::mem_row_major);
      }
      __syncthreads();
      // Online softmax: kThreadsPerRow threads per row, kKeysTile / kThreadsPerRow columns each.
      float local_max = -FLT_MAX;
      for (int col = sub; col < kKeysTile; col += kThreadsPerRow) {
        const bool ok = row_active && t0 + col <= pos_s[my_row];
        const float s = ok ? s_s[my_row * kKeysTile + col] * a.scale : -FLT_MAX;
        s_s[my_row * kKeysTile + col] = s;
        local_max = fmaxf(local_max, s);
      }
      for (int o = kThreadsPerRow / 2; o > 0; o >>= 1)
        local_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, o));
      const float m_old = m_s[my_row], m_new = fmaxf(m_old, local_max);
      float local_sum = 0.0f;
      for (int col = sub; col < kKeysTile; col += kThreadsPerRow) {
        const float s = s_s[my_row * kKeysTile + col];
        const float p = s == -FLT_MAX ? 0.0f : expf(s - m_new);
        p_s[my_row * kKeysTile + col] = __float2bfloat16_rn(p);
        local_sum += p;
      }
      for (int o = kThreadsPerRow / 2; o > 0; o >>= 1) local_sum += __shfl_xor_sync(0xffffffffu, local_sum, o);
      const float alpha = m_old == -FLT_MAX ? 0.0f : expf(m_old - m_new);
      for (std::int64_t d = sub; d < D; d += kThreadsPerRow) o_s[my_row * D + d] *= alpha;
      __syncwarp();
      if (sub == 0) {
        m_s[my_row] = m_new;
        l_s[my_row] = l_s[my_row] * alpha + local_sum;
      }
      __syncthreads();
      for (std::int64_t n = warp * 16; n < D; n += 4 * 16) {  // PV = P V: 16-column tiles spread over warps
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < kKeysTile; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
          wmma::load_matrix_sync(pa, p_s + k, kKeysTile);
          wmma::load_matrix_sync(vb, v_s + k * D + n, static_cast<unsigned>(D));
          wmma::mma_sync(acc, pa, vb, acc);
        }
        wmma::store_matrix_sync(pv_s + n, acc, static_cast<unsigned>(D), wmma::mem_row_major);
      }
      __syncthreads();
      for (std::int64_t d = sub; d < D; d += kThreadsPerRow) o_s[my_row * D + d] += pv_s[my_row * D + d];
    }
    __syncthreads();
    if (row_active) {
      const std::int64_t r = r0 + my_row;
      for (std::int64_t d = sub; d < D; d += kThreadsPerRow)
        a.out[(r * a.num_heads + head) * D + d] = o_s[my_row * D + d] / l_s[my_row];
    }
    __syncthreads();
    if (row_active && sub == 0) seq_s[my_row] = -1;  // done
  }
}

}  // namespace

bool prefill_attention_supported(const KvLayer& cache) {
  return cache.dtype == DType::bf16 && cache.head_dim % 16 == 0 && cache.head_dim <= 256;
}

void prefill_attention(const AttentionArgs& a, KvLayer cache, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (!prefill_attention_supported(cache))
    throw std::invalid_argument("prefill_attention: needs a bf16 cache, head_dim % 16 == 0, <= 256");
  if (a.num_heads % cache.num_kv_heads != 0)
    throw std::invalid_argument("prefill_attention: num_heads % num_kv_heads != 0");
  const Smem L(cache.head_dim);
  KVF_CUDA(cudaFuncSetAttribute(prefill_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(L.total)));
  const dim3 grid(static_cast<unsigned>((a.rows + kRowsTile - 1) / kRowsTile), static_cast<unsigned>(a.num_heads));
  prefill_attention_kernel<<<grid, kThreads, L.total, stream>>>(a, cache);
  check_launch("prefill_attention_kernel");
}

}  // namespace kvfleet::cuda
