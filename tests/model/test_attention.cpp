// The CPU paged attention (flash-style tiles, online softmax, GQA) against the two-pass double reference,
// for every KV dtype, and its invariance: a row gives the same bits alone, in a tile, chunked or batched,
// and on any number of threads, on every instruction-set path; the AVX2 and AVX-512 kernels give the plain
// steps' bits; reading K's transposed copy (KvLayer::kt) gives the bits of transposing K, also after K was written
// behind the copy.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/ops.h"

using namespace kvfleet;
using cpu::AttnRow;

namespace {

struct Case {
  std::int64_t heads = 6, kv_heads = 2, head_dim = 40, block_size = 5, num_blocks = 40;
  DType dtype = DType::f32;
};

// A cache of random K/V (stored through rope_store_kv so that 16-bit caches round as the engine does),
// three sequences' block tables, and a batch of rows: a 23-row prefill chunk (from position 38: not a block
// start), two decode rows, and with `long_chunk` a 40-row chunk of the second sequence from position 0.
struct Fixture {
  Case c;
  std::vector<std::byte> storage;
  cpu::KvLayer cache;
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<AttnRow> rows;
  std::vector<float> q;

  std::vector<std::byte> kt;  // with_kt: K transposed beside the cache (KvLayer::kt), as the CPU backend keeps it
  std::vector<std::uint8_t> kt_fresh;

  explicit Fixture(Case k, bool long_chunk = false, bool with_kt = false) : c(k) {
    cache = {nullptr, c.dtype, c.block_size, c.kv_heads, c.head_dim};
    storage.assign(static_cast<std::size_t>(c.num_blocks * cache.block_elems()) * dtype_size(c.dtype), std::byte{0});
    cache.base = storage.data();
    if (with_kt) {
      kt.assign(static_cast<std::size_t>(c.num_blocks * cache.kt_block_elems()) * dtype_size(c.dtype), std::byte{0});
      kt_fresh.assign(static_cast<std::size_t>(c.num_blocks), 1);
      cache.kt = kt.data();
      cache.kt_fresh = kt_fresh.data();
    }
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.5f);
    std::vector<std::int32_t> free(static_cast<std::size_t>(c.num_blocks));
    for (std::size_t i = 0; i < free.size(); ++i) free[i] = static_cast<std::int32_t>(i);
    std::shuffle(free.begin(), free.end(), rng);
    const std::int32_t lengths[] = {61, 80, 1};
    std::size_t next = 0;
    std::vector<float> inv_freq(static_cast<std::size_t>(c.head_dim / 2), 0.0f);  // rope off: k stored as is
    for (std::int32_t len : lengths) {
      std::vector<std::int32_t> table;
      for (std::int32_t p = 0; p < len; p += static_cast<std::int32_t>(c.block_size)) table.push_back(free[next++]);
      std::vector<float> k(static_cast<std::size_t>(len * c.kv_heads * c.head_dim)), v(k.size());
      for (auto& x : k) x = normal(rng);
      for (auto& x : v) x = normal(rng);
      std::vector<std::int32_t> pos(static_cast<std::size_t>(len));
      std::vector<std::int64_t> slots(pos.size());
      for (std::int32_t p = 0; p < len; ++p) {
        pos[static_cast<std::size_t>(p)] = p;
        slots[static_cast<std::size_t>(p)] = std::int64_t{table[static_cast<std::size_t>(p / c.block_size)]} * c.block_size + p % c.block_size;
      }
      std::vector<float> no_q;
      cpu::rope_store_kv({inv_freq.data(), c.head_dim}, no_q.data(), k.data(), v.data(), len, 0, pos.data(),
                         slots.data(), cache);
      tables.push_back(std::move(table));
    }
    for (std::int32_t p = 38; p < 61; ++p) rows.push_back({p, tables[0].data()});  // a prefill chunk
    rows.push_back({79, tables[1].data()});                                         // decode rows
    rows.push_back({0, tables[2].data()});
    if (long_chunk)
      for (std::int32_t p = 0; p < 40; ++p) rows.push_back({p, tables[1].data()});
    q.resize(rows.size() * static_cast<std::size_t>(c.heads * c.head_dim));
    for (auto& x : q) x = normal(rng);
  }
  std::int64_t row_floats() const { return c.heads * c.head_dim; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(c.head_dim)); }

  std::vector<float> run(ThreadPool& pool, std::int64_t first, std::int64_t n) const {
    std::vector<float> out(static_cast<std::size_t>(n * row_floats()));
    cpu::paged_attention(pool, q.data() + first * row_floats(), n, c.heads, rows.data() + first, cache, scale(),
                         out.data());
    return out;
  }
};

// The instruction-set paths this CPU has (attention's: avx512 / avx512bf16 run the AVX-512 kernel, avx2 the
// AVX2 one, scalar the plain steps query by query), restoring the process's choice afterwards.
struct IsaGuard {
  cpu::Isa saved = cpu::cpu_isa();
  ~IsaGuard() { cpu::set_cpu_isa(saved); }
};

std::vector<cpu::Isa> supported_isas() {
  std::vector<cpu::Isa> out;
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2, cpu::Isa::scalar})
    if (cpu::cpu_supports(isa)) out.push_back(isa);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("paged attention matches the two-pass reference for every KV dtype and shape") {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& [heads, kv_heads, head_dim, block_size] :
         {std::array<std::int64_t, 4>{6, 2, 40, 5}, {8, 8, 64, 16}, {4, 1, 16, 16}, {6, 3, 128, 7}}) {
      CAPTURE(dtype_name(dtype));
      const std::int64_t dim = head_dim, block = block_size;  // clang 14 cannot CAPTURE structured bindings
      CAPTURE(dim);
      CAPTURE(block);
      const Fixture f({heads, kv_heads, head_dim, block_size, 40, dtype});
      ThreadPool pool(2);
      const auto n = static_cast<std::int64_t>(f.rows.size());
      const std::vector<float> ours = f.run(pool, 0, n);
      std::vector<float> ref(ours.size());
      cpu::attention_reference(f.q.data(), n, heads, f.rows.data(), f.cache, f.scale(), ref.data());
      // The reference reads the same stored (rounded) K/V: what is left is fp32 against double arithmetic.
      CHECK(max_abs_diff(ours, ref) < 2e-5);
    }
  }
}

TEST_CASE("a row's attention is bit-identical alone, tiled, chunked, batched and on any thread count") {
  IsaGuard guard;
  for (cpu::Isa isa : supported_isas())
  for (DType dtype : {DType::f32, DType::bf16}) {
    cpu::set_cpu_isa(isa);
    CAPTURE(cpu::isa_name(isa));
    const Fixture f({6, 2, 40, 5, 40, dtype});
    ThreadPool one(1), three(3);
    const auto n = static_cast<std::int64_t>(f.rows.size());
    const std::vector<float> batch = f.run(three, 0, n);
    CHECK(f.run(one, 0, n) == batch);
    for (std::int64_t r = 0; r < n; ++r) {  // every row alone: a tile of one
      const std::vector<float> alone = f.run(one, r, 1);
      CHECK(std::equal(alone.begin(), alone.end(), batch.begin() + static_cast<std::ptrdiff_t>(r * f.row_floats())));
    }
    for (std::int64_t split : {1, 7, 16, 22}) {  // the prefill chunk cut in two at other tile boundaries
      std::vector<float> joined = f.run(one, 0, split);
      const std::vector<float> rest = f.run(three, split, n - split);
      joined.insert(joined.end(), rest.begin(), rest.end());
      CHECK(joined == batch);
    }
  }
}

TEST_CASE("the AVX2 and AVX-512 attention kernels give the plain steps' bits for every shape, GQA group and KV dtype") {
  IsaGuard guard;
  std::vector<cpu::Isa> kernels;  // cpu_isa() scalar runs the plain steps query by query, the reference here
  for (cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::avx512})
    if (cpu::cpu_supports(isa)) kernels.push_back(isa);
  if (!cpu::cpu_supports(cpu::Isa::avx512)) MESSAGE("this CPU has no AVX-512: the AVX-512 attention kernel is not tested here");
  // {heads, kv_heads, head_dim, block_size}: GQA groups 1, 3, 4, 8; head_dim 64, 128 and ones that are not
  // multiples of 16 (40, 36: also not of 8, so the scalar tails run) or of 4 (22); blocks smaller than, equal
  // to and larger than a group of 16 keys; packs of 6 queries with 1-5 left over.
  const std::array<std::int64_t, 4> shapes[] = {{12, 4, 64, 16}, {6, 2, 40, 5}, {8, 8, 64, 16}, {8, 1, 128, 16},
                                                {16, 4, 128, 7}, {4, 4, 36, 32}, {6, 2, 22, 16}, {24, 3, 64, 20}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const auto& shape : shapes) {
      const std::int64_t heads = shape[0], kv_heads = shape[1], dim = shape[2], block = shape[3];
      CAPTURE(dtype_name(dtype));
      CAPTURE(heads);
      CAPTURE(kv_heads);
      CAPTURE(dim);
      CAPTURE(block);
      const Fixture f({heads, kv_heads, dim, block, 60, dtype}, true);
      ThreadPool pool(2);
      const auto n = static_cast<std::int64_t>(f.rows.size());
      cpu::set_cpu_isa(cpu::Isa::scalar);
      const std::vector<float> plain = f.run(pool, 0, n);
      std::vector<float> ref(plain.size());
      cpu::attention_reference(f.q.data(), n, heads, f.rows.data(), f.cache, f.scale(), ref.data());
      CHECK(max_abs_diff(plain, ref) < 2e-5);
      for (cpu::Isa isa : kernels) {
        CAPTURE(cpu::isa_name(isa));
        cpu::set_cpu_isa(isa);
        const std::vector<float> ours = f.run(pool, 0, n);
        CHECK(std::memcmp(ours.data(), plain.data(), plain.size() * sizeof(float)) == 0);
        for (std::int64_t r = 0; r < n; r += 5) {  // rows alone (decode-like tiles of one) and short chunks
          const std::vector<float> alone = f.run(pool, r, std::min<std::int64_t>(3, n - r));
          CHECK(std::equal(alone.begin(), alone.end(), plain.begin() + static_cast<std::ptrdiff_t>(r * f.row_floats())));
        }
      }
    }
}

TEST_CASE("attention on K's transposed copy gives the bits of transposing K, and a stale copy is refreshed") {
  IsaGuard guard;
  // Blocks of 5, 7, 16, 20 and 32 keys: within one group of 16, exactly one, and spanning two (padding lanes).
  const std::array<std::int64_t, 4> shapes[] = {{6, 2, 40, 5}, {12, 4, 64, 16}, {16, 4, 128, 7}, {24, 3, 64, 20},
                                                {4, 4, 36, 32}};
  for (cpu::Isa isa : supported_isas())
    for (DType dtype : {DType::f32, DType::bf16, DType::f16})
      for (const auto& shape : shapes) {
        cpu::set_cpu_isa(isa);
        const std::int64_t heads = shape[0], kv_heads = shape[1], dim = shape[2], block = shape[3];
        CAPTURE(cpu::isa_name(isa));
        CAPTURE(dtype_name(dtype));
        CAPTURE(dim);
        CAPTURE(block);
        const Fixture plain({heads, kv_heads, dim, block, 60, dtype}, true);
        Fixture f({heads, kv_heads, dim, block, 60, dtype}, true, /*with_kt=*/true);
        ThreadPool pool(2);
        const auto n = static_cast<std::int64_t>(f.rows.size());
        const std::vector<float> want = plain.run(pool, 0, n);
        // rope_store_kv kept the copy: every block fresh, and the same bits as transposing K.
        CHECK(std::count(f.kt_fresh.begin(), f.kt_fresh.end(), 0) == 0);
        CHECK(f.run(pool, 0, n) == want);
        for (std::int64_t r = 0; r < n; r += 7) {  // decode-like tiles of one
          const std::vector<float> alone = f.run(pool, r, 1);
          CHECK(std::equal(alone.begin(), alone.end(), want.begin() + static_cast<std::ptrdiff_t>(r * f.row_floats())));
        }
        // The copy is what is read: garbage in a block still marked fresh changes the output...
        std::fill(f.kt.begin(), f.kt.end(), std::byte{0x3c});
        CHECK(f.run(pool, 0, n) != want);
        // ...and marked stale (K written behind it, as a transfer does), it is transposed again from K.
        std::fill(f.kt_fresh.begin(), f.kt_fresh.end(), std::uint8_t{0});
        CHECK(f.run(pool, 0, n) == want);
        const std::int32_t read = f.tables[0][0];  // a block the rows reach is fresh again
        CHECK(f.kt_fresh[static_cast<std::size_t>(read)] == 1);
        CHECK(f.run(pool, 0, n) == want);
      }
}
