// RoPE + paged K/V store and paged attention on CUDA against the CPU reference: prefill rows with long
// contexts (several 256-token partitions), short ones and decode rows, GQA, scattered block tables, the
// second layer of the cache; and the batch invariance the engine relies on.
#include <algorithm>
#include <numeric>

#include "cuda_test_env.h"
#include "kvfleet/model_runner.h"

using namespace kvfleet;
using test::DeviceVec;

namespace {

struct Step {
  std::vector<std::int32_t> positions, table_offsets, tables;
  std::vector<std::int64_t> slots;
};

// Rows for every position of sequences of the given lengths, each sequence on shuffled blocks.
Step make_step(const std::vector<std::int32_t>& lengths, std::int64_t block_size, std::int64_t num_blocks,
               std::mt19937& rng) {
  std::vector<std::int32_t> free(static_cast<std::size_t>(num_blocks));
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), rng);
  Step s;
  std::size_t next = 0;
  for (std::int32_t len : lengths) {
    const auto offset = static_cast<std::int32_t>(s.tables.size());
    const std::int64_t blocks = (len + block_size - 1) / block_size;
    for (std::int64_t b = 0; b < blocks; ++b) s.tables.push_back(free.at(next++));
    for (std::int32_t pos = 0; pos < len; ++pos) {
      s.positions.push_back(pos);
      s.table_offsets.push_back(offset);
      s.slots.push_back(std::int64_t{s.tables[static_cast<std::size_t>(offset + pos / block_size)]} * block_size +
                        pos % block_size);
    }
  }
  return s;
}

struct Dims {
  std::int64_t heads, kv_heads, head_dim;
  DType weights;  // decides the CUDA cache dtype: bf16 for 16-bit checkpoints
};

void check_attention(const Dims& d) {
  std::mt19937 rng(static_cast<unsigned>(d.head_dim * 31 + d.heads));
  const std::int64_t block_size = 16, num_blocks = 64, layer = 1;
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend({});
  test::HostWeight dummy(test::random_floats(8, rng), d.weights, {8});
  gpu->upload_weight(dummy.view);
  const KvCacheShape shape{2, num_blocks, block_size, d.kv_heads, d.head_dim};
  cpu->allocate_kv_cache(shape);
  gpu->allocate_kv_cache(shape);
  // 700 tokens: three partitions; 37: several blocks; 1: a lone first token.
  const Step s = make_step({700, 37, 1}, block_size, num_blocks, rng);
  const auto rows = static_cast<std::int64_t>(s.positions.size());
  auto q = test::random_floats(rows * d.heads * d.head_dim, rng),
       k = test::random_floats(rows * d.kv_heads * d.head_dim, rng);
  const auto v = test::random_floats(rows * d.kv_heads * d.head_dim, rng);
  ModelConfig cfg;
  cfg.head_dim = d.head_dim;
  cfg.rope_theta = 10000.0;
  const auto inv_freq = rope_inv_freq(cfg);

  const std::int32_t max_pos = *std::max_element(s.positions.begin(), s.positions.end());
  const AttentionMeta host_meta{rows,   s.positions.data(), s.slots.data(), s.table_offsets.data(), s.tables.data(),
                                max_pos};
  DeviceVec<std::int32_t> d_pos(*gpu, s.positions), d_off(*gpu, s.table_offsets), d_tab(*gpu, s.tables);
  DeviceVec<std::int64_t> d_slots(*gpu, s.slots);
  DeviceVec<float> d_q(*gpu, q), d_k(*gpu, k), d_v(*gpu, v), d_inv(*gpu, inv_freq);
  DeviceVec<float> d_out(*gpu, static_cast<std::size_t>(rows * d.heads * d.head_dim));
  const AttentionMeta meta{rows, d_pos.get(), d_slots.get(), d_off.get(), d_tab.get(), max_pos};

  const bool bf16_cache = d.weights != DType::f32;
  const std::vector<float> q_raw_host = q;  // before rope_store_kv rotates q in place
  cpu->rope_store_kv(layer, inv_freq.data(), q.data(), k.data(), v.data(), d.heads, host_meta);
  gpu->rope_store_kv(layer, d_inv.get(), d_q.get(), d_k.get(), d_v.get(), d.heads, meta);
  CHECK(test::rel_error(d_q.host(), q) < 1e-6);  // cosf/sinf vs std::cos/sin: an ulp or two
  // The cache: every used block, K and V, in the shared layout (bf16: one rounding, rel 2^-9 per element).
  std::vector<float> want(static_cast<std::size_t>(shape.block_elems())), got(want.size());
  for (std::int32_t b : s.tables) {
    cpu->read_kv_block(layer, b, want.data());
    gpu->read_kv_block(layer, b, got.data());
    REQUIRE(test::rel_error(got, want) < (bf16_cache ? 4e-3 : 1e-6));
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  std::vector<float> out(static_cast<std::size_t>(rows * d.heads * d.head_dim));
  cpu->paged_attention(layer, q.data(), d.heads, host_meta, scale, out.data());
  gpu->paged_attention(layer, d_q.get(), d.heads, meta, scale, d_out.get());
  const auto batch = d_out.host();
  // f32 cache: fp32 sums in another order. bf16 cache: K and V rounded to bf16 (the CPU keeps fp32).
  CHECK(test::rel_error(batch, out) < (bf16_cache ? 2e-2 : 1e-5));

  // The tensor-core prefill kernel (fast mode, bf16 cache): q and P rounded to bf16 on top.
  if (bf16_cache) {
    BackendOptions fast_options;
    fast_options.batch_invariant = false;
    auto fast = make_cuda_backend(fast_options);
    fast->upload_weight(dummy.view);
    fast->allocate_kv_cache(shape);
    DeviceVec<float> fk(*fast, k), fv(*fast, v), finv(*fast, inv_freq), fout(*fast, out.size());
    DeviceVec<float> q_raw(*fast, q_raw_host);
    DeviceVec<std::int32_t> fpos(*fast, s.positions), foff(*fast, s.table_offsets), ftab(*fast, s.tables);
    DeviceVec<std::int64_t> fslots(*fast, s.slots);
    const AttentionMeta fmeta{rows, fpos.get(), fslots.get(), foff.get(), ftab.get(), max_pos, 3};
    fast->rope_store_kv(layer, finv.get(), q_raw.get(), fk.get(), fv.get(), d.heads, fmeta);
    fast->paged_attention(layer, q_raw.get(), d.heads, fmeta, scale, fout.get());
    const double err = test::rel_error(fout.host(), out);
    MESSAGE("tensor-core prefill attention vs CPU: " << err);
    CHECK(err < 3e-2);
  }

  // A row alone (decode-style, one row, max_position unknown to the backend) equals its row in the batch.
  for (std::int64_t r : {std::int64_t{699}, std::int64_t{255}, std::int64_t{256}, rows - 1}) {
    CAPTURE(r);
    const AttentionMeta one{1, d_pos.get() + r, d_slots.get() + r, d_off.get() + r, d_tab.get(), -1};
    DeviceVec<float> alone(*gpu, static_cast<std::size_t>(d.heads * d.head_dim));
    gpu->paged_attention(layer, d_q.get() + r * d.heads * d.head_dim, d.heads, one, scale, alone.get());
    const auto a = alone.host();
    CHECK(std::equal(a.begin(), a.end(), batch.begin() + r * d.heads * d.head_dim));
  }
}

}  // namespace

TEST_CASE("cuda: rope_store_kv and paged attention match the CPU, f32 cache") {
  KVF_REQUIRE_GPU_OR_SKIP();
  check_attention({8, 2, 64, DType::f32});
  check_attention({4, 4, 128, DType::f32});
  check_attention({6, 2, 96, DType::f32});  // head_dim not a power of two
}

TEST_CASE("cuda: rope_store_kv and paged attention match the CPU, bf16 cache") {
  KVF_REQUIRE_GPU_OR_SKIP();
  check_attention({8, 2, 64, DType::bf16});
  check_attention({32, 8, 64, DType::bf16});  // Llama-3.2-1B's heads
}
