// The two-pass attention that paged_attention is tested against: one query head at a time, in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {

void attention_reference(const float* q, std::int64_t rows, std::int64_t num_heads, const AttnRow* row_info,
                         KvLayer c, float scale, float* out) {
  const std::int64_t d = c.head_dim, group = num_heads / c.num_kv_heads;
  std::vector<double> scores, acc(static_cast<std::size_t>(d));
  for (std::int64_t i = 0; i < rows * num_heads; ++i) {
    const AttnRow& row = row_info[i / num_heads];
    const std::int64_t kv = i % num_heads / group, n = row.position + 1;
    const float* qi = q + i * d;
    auto elem = [&](std::int64_t offset) { return static_cast<double>(load_as_f32(c.base, c.dtype, offset)); };
    scores.assign(static_cast<std::size_t>(n), 0.0);
    double m = -INFINITY;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t k = c.k_offset(row.block_table[j / c.block_size], kv, j % c.block_size);
      double s = 0.0;
      for (std::int64_t x = 0; x < d; ++x) s += static_cast<double>(qi[x]) * elem(k + x);
      m = std::max(m, scores[static_cast<std::size_t>(j)] = s * scale);
    }
    double sum = 0.0;
    for (double& s : scores) sum += (s = std::exp(s - m));
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t v = c.v_offset(row.block_table[j / c.block_size], kv, j % c.block_size);
      for (std::int64_t x = 0; x < d; ++x) acc[static_cast<std::size_t>(x)] += scores[static_cast<std::size_t>(j)] * elem(v + x);
    }
    for (std::int64_t x = 0; x < d; ++x) out[i * d + x] = static_cast<float>(acc[static_cast<std::size_t>(x)] / sum);
  }
}

}  // namespace kvfleet::cpu
