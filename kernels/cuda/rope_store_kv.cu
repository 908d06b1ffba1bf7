// Rotary embedding fused with the paged K/V store (CPU reference: kernels/cpu/rope_store_kv.cpp).
// One block per row; a thread per (head, i) pair of the HF rotate_half convention. The angle is the fp32
// product inv_freq[i] * position, as transformers computes it, through the accurate cosf/sinf.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

template <typename KV>
__global__ void rope_store_kv_kernel(const float* inv_freq, float* q, const float* k, const float* v,
                                     std::int64_t num_heads, const std::int32_t* positions, const std::int64_t* slots,
                                     KV* cache, std::int64_t block_size, std::int64_t kv_heads, std::int64_t head_dim) {
  const std::int64_t row = blockIdx.x, half = head_dim / 2;
  const float pos = static_cast<float>(positions[row]);
  const std::int64_t block = slots[row] / block_size, offset = slots[row] % block_size;
  KV* k_block = cache + block * 2 * kv_heads * block_size * head_dim;
  KV* v_block = k_block + kv_heads * block_size * head_dim;
  for (std::int64_t p = threadIdx.x; p < (num_heads + kv_heads) * half; p += blockDim.x) {
    const std::int64_t head = p / half, i = p % half;
    const float f = inv_freq[i] * pos;
    const float c = cosf(f), s = sinf(f);
    if (head < num_heads) {
      float* x = q + (row * num_heads + head) * head_dim;
      const float a = x[i], b = x[i + half];
      x[i] = a * c - b * s;
      x[i + half] = b * c + a * s;
    } else {
      const std::int64_t h = head - num_heads;
      const float* x = k + (row * kv_heads + h) * head_dim;
      const float a = x[i], b = x[i + half];
      KV* dst = k_block + (h * block_size + offset) * head_dim;
      dst[i] = from_float<KV>(a * c - b * s);
      dst[i + half] = from_float<KV>(b * c + a * s);
      const float* vs = v + (row * kv_heads + h) * head_dim;
      KV* vd = v_block + (h * block_size + offset) * head_dim;
      vd[i] = from_float<KV>(vs[i]);
      vd[i + half] = from_float<KV>(vs[i + half]);
    }
  }
}

}  // namespace

void rope_store_kv(const float* inv_freq, float* q, const float* k, const float* v, std::int64_t rows,
                   std::int64_t num_heads, const std::int32_t* positions, const std::int64_t* slots, KvLayer cache,
                   cudaStream_t stream) {
  if (rows == 0) return;
  if (cache.head_dim % 2 != 0) throw std::invalid_argument("rope_store_kv: head_dim must be even");
  if (cache.dtype == DType::f16) throw std::invalid_argument("rope_store_kv: the KV cache is f32 or bf16");
  KVF_DISPATCH_DTYPE(cache.dtype, KV,
                     rope_store_kv_kernel<KV><<<static_cast<unsigned>(rows), 256, 0, stream>>>(
                         inv_freq, q, k, v, num_heads, positions, slots, static_cast<KV*>(cache.base), cache.block_size,
                         cache.num_kv_heads, cache.head_dim));
  check_launch("rope_store_kv_kernel");
}

}  // namespace kvfleet::cuda
