// Paged attention on the CPU: flash-style, one work item per (tile of query rows, kv head).
//
// A tile is up to kTileRows consecutive rows of one sequence (a prefill chunk; a decode row is a tile of
// one). For every K/V block the tile's rows reach, the block is widened to fp32 once and used by all the
// tile's rows and all the query heads of the kv head's GQA group. Softmax is online: per block, the running
// max m, the running sum l and the accumulator are rescaled by exp(m_old - m_new). The blocks are visited
// in absolute key order and each query's arithmetic depends only on its own position and the cache, so a
// row gives the same bits in a tile of any size, in any batch, chunked or not, on any number of threads.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "kernels/cpu/kv_elem.h"
#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

constexpr std::int64_t kTileRows = 16;
constexpr int kLanes = 16;  // partial sums of a dot product: fixed, whatever the vector width

// q . k with kLanes partial sums and a fixed pairwise reduction: vectorizes, and the order is a function
// of head_dim alone.
inline float dot(const float* a, const float* b, std::int64_t d) {
  float lane[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < d; ++l) lane[l] += a[i + l] * b[i + l];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

// e^x for x <= 0 (scores minus their running max), Cephes' expf polynomial (within 2 ulp of expf): plain
// arithmetic, so that the loop over a block's scores vectorizes where calls to expf would not. Below -87
// (under 1e-38 of the largest weight) it returns 0, and exp(-inf) of the first block's rescale is 0.
inline float exp_nonpositive(float x) {
  const bool tiny = x < -87.0f;
  x = tiny ? -87.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const auto scale = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  return tiny ? 0.0f : p * scale;
}

// The running state of one query head: max, sum of exp, unnormalized output.
struct QueryState {
  const float* q;
  float* acc;
  std::int32_t position;
  float m, l;
};

struct Scratch {
  std::vector<float> k, v, p, alpha, acc;
  std::vector<QueryState> qs;
};

// A block's K or V of one kv head, slots [0, n), as fp32: in place for an fp32 cache, widened otherwise.
template <class T>
const float* block_rows(const KvLayer& c, std::int64_t offset, std::int64_t n, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    (void)n;
    (void)buf;
    return c.at<float>(offset);
  } else {
    widen(c.at<T>(offset), buf.data(), n * c.head_dim);
    return buf.data();
  }
}

// Scores of one query against slots [0, n) of a block; updates m and l and leaves the block's weights in p
// and the rescale of the old accumulator in alpha.
inline void score_block(QueryState& s, const float* k, std::int64_t n, std::int64_t d, float scale, float* p,
                        float& alpha) {
  float mb = -INFINITY;
  for (std::int64_t j = 0; j < n; ++j) mb = std::max(mb, p[j] = dot(s.q, k + j * d, d) * scale);
  const float m_new = std::max(s.m, mb);
  alpha = exp_nonpositive(s.m - m_new);  // 0 on the first block (m = -inf): acc and l are 0 anyway
  for (std::int64_t j = 0; j < n; ++j) p[j] = exp_nonpositive(p[j] - m_new);
  float sum = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) sum += p[j];
  s.l = s.l * alpha + sum;
  s.m = m_new;
}

// acc = acc * alpha + sum_j p[j] * v[j], element by element in slot order; 16 elements at a time held in
// registers across the block's slots (the order per element is the same as a plain loop's).
inline void accumulate_block(QueryState& s, const float* v, std::int64_t n, std::int64_t d, const float* p,
                             float alpha) {
  std::int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    float a[kLanes];
    for (int l = 0; l < kLanes; ++l) a[l] = s.acc[i + l] * alpha;
    for (std::int64_t j = 0; j < n; ++j)
      for (int l = 0; l < kLanes; ++l) a[l] += p[j] * v[j * d + i + l];
    for (int l = 0; l < kLanes; ++l) s.acc[i + l] = a[l];
  }
  for (; i < d; ++i) {
    float a = s.acc[i] * alpha;
    for (std::int64_t j = 0; j < n; ++j) a += p[j] * v[j * d + i];
    s.acc[i] = a;
  }
}

// Rows [r0, r0 + nr) of one sequence (consecutive positions), kv head h, all the heads of its group.
template <class T>
void attend_tile(const float* q, std::int64_t r0, std::int64_t nr, std::int64_t num_heads, std::int64_t h,
                 const AttnRow* rows, const KvLayer& c, float scale, float* out, Scratch& s) {
  const std::int64_t d = c.head_dim, bs = c.block_size, group = num_heads / c.num_kv_heads;
  const std::int64_t nq = nr * group;
  s.qs.resize(static_cast<std::size_t>(nq));
  s.acc.assign(static_cast<std::size_t>(nq * d), 0.0f);
  s.p.resize(static_cast<std::size_t>(nq * bs));
  s.alpha.resize(static_cast<std::size_t>(nq));
  if constexpr (!std::is_same_v<T, float>) {
    s.k.resize(static_cast<std::size_t>(bs * d));
    s.v.resize(static_cast<std::size_t>(bs * d));
  }
  std::int32_t last = 0;
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::int64_t r = r0 + i / group, head = h * group + i % group;
    s.qs[static_cast<std::size_t>(i)] = {q + (r * num_heads + head) * d, s.acc.data() + i * d, rows[r].position,
                                         -INFINITY, 0.0f};
    last = std::max(last, rows[r].position);
  }
  const std::int32_t* table = rows[r0].block_table;
  for (std::int64_t b = 0; b * bs <= last; ++b) {
    const std::int64_t start = b * bs, n_block = std::min(bs, last - start + 1);
    const float* k = block_rows<T>(c, c.k_offset(table[b], h, 0), n_block, s.k);
    for (std::int64_t i = 0; i < nq; ++i) {
      QueryState& qs = s.qs[static_cast<std::size_t>(i)];
      if (qs.position < start) continue;
      score_block(qs, k, std::min(bs, qs.position - start + 1), d, scale, s.p.data() + i * bs,
                  s.alpha[static_cast<std::size_t>(i)]);
    }
    const float* v = block_rows<T>(c, c.v_offset(table[b], h, 0), n_block, s.v);
    for (std::int64_t i = 0; i < nq; ++i) {
      QueryState& qs = s.qs[static_cast<std::size_t>(i)];
      if (qs.position < start) continue;
      accumulate_block(qs, v, std::min(bs, qs.position - start + 1), d, s.p.data() + i * bs,
                       s.alpha[static_cast<std::size_t>(i)]);
    }
  }
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::int64_t r = r0 + i / group, head = h * group + i % group;
    const QueryState& qs = s.qs[static_cast<std::size_t>(i)];
    float* o = out + (r * num_heads + head) * d;
    const float inv = 1.0f / qs.l;
    for (std::int64_t x = 0; x < d; ++x) o[x] = qs.acc[x] * inv;
  }
}

struct Tile {
  std::int64_t begin, rows;
};

// Consecutive rows of one sequence at consecutive positions, at most kTileRows each, into `tiles`
// (the caller's reused buffer: no allocation per call once it has grown).
void make_tiles(const AttnRow* rows, std::int64_t n, std::vector<Tile>& tiles) {
  tiles.clear();
  for (std::int64_t r = 0; r < n; ++r) {
    if (!tiles.empty()) {
      Tile& t = tiles.back();
      const AttnRow& prev = rows[t.begin + t.rows - 1];
      if (t.rows < kTileRows && rows[r].block_table == prev.block_table && rows[r].position == prev.position + 1) {
        ++t.rows;
        continue;
      }
    }
    tiles.push_back({r, 1});
  }
}

}  // namespace

void paged_attention(ThreadPool& pool, const float* q, std::int64_t rows, std::int64_t num_heads,
                     const AttnRow* row_info, KvLayer cache, float scale, float* out) {
  thread_local std::vector<Tile> caller_tiles;
  std::vector<Tile>& tiles = caller_tiles;  // a reference: the workers must read the caller's tiles, not theirs
  make_tiles(row_info, rows, tiles);
  const std::int64_t kvh = cache.num_kv_heads, items = static_cast<std::int64_t>(tiles.size()) * kvh;
  with_kv_type(cache.dtype, [&](auto elem) {
    using T = decltype(elem);
    pool.parallel_for(items, 1, [&](std::int64_t begin, std::int64_t end) {
      thread_local Scratch scratch;
      for (std::int64_t i = begin; i < end; ++i) {
        const Tile& t = tiles[static_cast<std::size_t>(i / kvh)];
        attend_tile<T>(q, t.begin, t.rows, num_heads, i % kvh, row_info, cache, scale, out, scratch);
      }
    });
  });
}

}  // namespace kvfleet::cpu
