#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/kv_elem.h"
#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

// HF's rotate_half convention: the two halves of a head are the pair, not adjacent elements.
void rotate(float* x, const float* cos, const float* sin, std::int64_t half) {
  for (std::int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

// K is rotated in fp32 and rounded once to the cache's type (as V is): a 16-bit cache holds the nearest
// value of what the fp32 cache holds. Rows [r0, r1); the work buffer is the calling thread's, sized once.
template <class T>
void store_rows(const Rope& rope, float* q, const float* k, const float* v, std::int64_t r0, std::int64_t r1,
                std::int64_t num_heads, const std::int32_t* positions, const std::int64_t* slots, const KvLayer& cache) {
  const std::int64_t d = rope.head_dim, half = d / 2, kvh = cache.num_kv_heads;
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<std::size_t>(2 * half + d)) buf.resize(static_cast<std::size_t>(2 * half + d));
  float *cos = buf.data(), *sin = cos + half, *kr = sin + half;
  for (std::int64_t r = r0; r < r1; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (std::int64_t i = 0; i < half; ++i) {
      const float f = rope.inv_freq[i] * pos;  // fp32 product, as transformers computes it
      cos[i] = std::cos(f);
      sin[i] = std::sin(f);
    }
    for (std::int64_t h = 0; h < num_heads; ++h) rotate(q + (r * num_heads + h) * d, cos, sin, half);
    const std::int64_t block = slots[r] / cache.block_size, offset = slots[r] % cache.block_size;
    for (std::int64_t h = 0; h < kvh; ++h) {
      std::memcpy(kr, k + (r * kvh + h) * d, static_cast<std::size_t>(d) * sizeof(float));
      rotate(kr, cos, sin, half);
      T* key = cache.at<T>(cache.k_offset(block, h, offset));
      narrow(kr, key, d);
      narrow(v + (r * kvh + h) * d, cache.at<T>(cache.v_offset(block, h, offset)), d);
      if (cache.kt) {  // the transposed copy: the same elements
        T* kt = cache.kt_at<T>(cache.kt_offset(block, h) + cache.kt_slot_offset(offset, 0));
        for (std::int64_t i = 0; i < d; ++i) kt[i * KvLayer::kKtKeys] = key[i];
      }
    }
  }
}

}  // namespace

void rope_store_kv(const Rope& rope, float* q, const float* k, const float* v, std::int64_t rows,
                   std::int64_t num_heads, const std::int32_t* positions, const std::int64_t* slots, KvLayer cache) {
  with_kv_type(cache.dtype, [&](auto elem) {
    store_rows<decltype(elem)>(rope, q, k, v, 0, rows, num_heads, positions, slots, cache);
  });
}

// A row is ~1-2 us (its sines and cosines, every head's rotation): 16 rows are worth a hand-off.
void rope_store_kv(ThreadPool& pool, const Rope& rope, float* q, const float* k, const float* v, std::int64_t rows,
                   std::int64_t num_heads, const std::int32_t* positions, const std::int64_t* slots, KvLayer cache) {
  with_kv_type(cache.dtype, [&](auto elem) {
    pool.parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
      store_rows<decltype(elem)>(rope, q, k, v, r0, r1, num_heads, positions, slots, cache);
    });
  });
}

}  // namespace kvfleet::cpu
