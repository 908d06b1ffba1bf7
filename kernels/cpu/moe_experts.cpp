#include <algorithm>

#include "kernels/cpu/moe.h"

namespace kvfleet::cpu {
namespace {

template <class T>
T* sized(std::vector<T>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
  return v.data();
}

}  // namespace

void moe_experts(ThreadPool& pool, MoeScratch& s, const float* x, std::int64_t rows, std::int64_t hidden,
                 std::int64_t inter, const std::int32_t* ids, const float* weights, std::int64_t top_k,
                 const ExpertRef* experts, std::int64_t num_experts, float* out, std::int32_t* counts) {
  const std::int64_t pairs = rows * top_k;
  // Counting sort of the (row, rank) pairs by expert; a pair's grouped position is where its row's input
  // and output live while its expert runs. Within an expert, pairs stay in row order.
  std::int32_t* offsets = sized(s.offsets, num_experts + 1);
  std::fill(offsets, offsets + num_experts + 1, 0);
  for (std::int64_t i = 0; i < pairs; ++i) ++offsets[ids[i] + 1];
  for (std::int64_t e = 0; e < num_experts; ++e) {
    if (counts) counts[e] += offsets[e + 1];
    offsets[e + 1] += offsets[e];
  }
  std::int32_t* position = sized(s.order, pairs);  // pair -> grouped position
  {
    std::vector<std::int32_t> next(offsets, offsets + num_experts);
    for (std::int64_t i = 0; i < pairs; ++i) position[i] = next[static_cast<std::size_t>(ids[i])]++;
  }
  float* xs = sized(s.xs, pairs * hidden);
  for (std::int64_t i = 0; i < pairs; ++i) std::copy_n(x + (i / top_k) * hidden, hidden, xs + position[i] * hidden);

  float* g = sized(s.gate, pairs * inter);
  float* u = sized(s.up, pairs * inter);
  float* ys = sized(s.ys, pairs * hidden);
  for (std::int64_t e = 0; e < num_experts; ++e) {
    const std::int64_t begin = offsets[e], n = offsets[e + 1] - begin;
    if (n == 0) continue;
    const ExpertRef& w = experts[e];
    linear(pool, xs + begin * hidden, n, hidden, w.gate, inter, {}, g + begin * inter);
    linear(pool, xs + begin * hidden, n, hidden, w.up, inter, {}, u + begin * inter);
    silu_mul(g + begin * inter, u + begin * inter, n * inter);
    linear(pool, g + begin * inter, n, inter, w.down, hidden, {}, ys + begin * hidden);
  }
  moe_combine(ys, position, weights, rows, top_k, hidden, out);
}

// In top-k rank order, from zero: the fixed order that keeps every row batch-invariant. The one combine
// of the single-rank and the expert-parallel paths, so both give the same bits.
void moe_combine(const float* ys, const std::int32_t* position, const float* weights, std::int64_t rows,
                 std::int64_t top_k, std::int64_t hidden, float* out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* o = out + r * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (std::int64_t j = 0; j < top_k; ++j) {
      const float w = weights[r * top_k + j];
      const float* y = ys + position[r * top_k + j] * hidden;
      for (std::int64_t d = 0; d < hidden; ++d) o[d] += w * y[d];
    }
  }
}

}  // namespace kvfleet::cpu
