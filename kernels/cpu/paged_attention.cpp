#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

// One query head over its sequence's keys [0, position]: scores, max, exp, weighted sum of V. Two passes
// over a scratch row keep it exact and independent of how the context is split into blocks.
void attend(const float* q, const AttnRow& row, std::int64_t kv_head, const KvLayer& c, float scale,
            std::vector<float>& scores, float* out) {
  const std::int64_t n = row.position + 1, d = c.head_dim;
  scores.resize(static_cast<std::size_t>(n));
  float m = -INFINITY;
  for (std::int64_t j = 0; j < n; ++j) {
    const float* k = c.k(row.block_table[j / c.block_size], kv_head, j % c.block_size);
    float s = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) s += q[i] * k[i];
    s *= scale;
    scores[static_cast<std::size_t>(j)] = s;
    m = std::max(m, s);
  }
  float sum = 0.0f;
  for (auto& s : scores) sum += (s = std::exp(s - m));
  std::fill(out, out + d, 0.0f);
  for (std::int64_t j = 0; j < n; ++j) {
    const float* v = c.v(row.block_table[j / c.block_size], kv_head, j % c.block_size);
    const float p = scores[static_cast<std::size_t>(j)] / sum;
    for (std::int64_t i = 0; i < d; ++i) out[i] += p * v[i];
  }
}

}  // namespace

void paged_attention(ThreadPool& pool, const float* q, std::int64_t rows, std::int64_t num_heads,
                     const AttnRow* row_info, KvLayer cache, float scale, float* out) {
  const std::int64_t d = cache.head_dim, group = num_heads / cache.num_kv_heads;
  pool.parallel_for(rows * num_heads, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> scores;
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t r = i / num_heads, h = i % num_heads;
      attend(q + i * d, row_info[r], h / group, cache, scale, scores, out + i * d);
    }
  });
}

}  // namespace kvfleet::cpu
