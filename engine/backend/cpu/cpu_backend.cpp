// The CPU backend: host memory, the kernels of kernels/cpu, a KV cache of fp32 (default), bf16 or fp16
// (--kv-cache-dtype; arithmetic stays fp32, 16-bit halves the KV traffic and matches the CUDA block bytes),
// and beside it K transposed for attention (cpu::KvLayer::kt: 1.5x the cache's bytes in all at block sizes
// that are multiples of 16).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/backend/cpu/huge_page_arena.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/kv_elem.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/ops.h"
#include "kvfleet/backend.h"

namespace kvfleet {
namespace {

cpu::WeightRef ref(DeviceWeight w) { return {w.data, w.dtype}; }

// Whether [begin, end) lies inside one private mapping of a file that this process cannot write
// (/proc/self/maps: perms r--p or r-xp, an inode): the safetensors checkpoint's mapping.
bool in_read_only_file_mapping(std::uintptr_t begin, std::uintptr_t end) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0, offset = 0, inode = 0;
    char perms[5] = {}, dev[32] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s %lx %31s %lu", &lo, &hi, perms, &offset, dev, &inode) != 6) continue;
    if (begin < lo || begin >= hi) continue;
    return end <= hi && inode != 0 && perms[1] == '-' && perms[3] == 'p';
  }
  return false;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(unsigned threads, DType kv_dtype) : pool_(threads), kv_dtype_(kv_dtype) {}

  std::string_view name() const override { return "cpu"; }

  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  // n == 0 comes with null pointers (an empty step's vectors): memcpy must not see them.
  void to_device(void* dst, const void* src, std::size_t n) override {
    if (n) std::memcpy(dst, src, n);
  }
  void to_host(void* dst, const void* src, std::size_t n) override {
    if (n) std::memcpy(dst, src, n);
  }
  DeviceWeight upload_weight(const TensorView& t) override { return {t.data, t.dtype}; }

  void allocate_kv_cache(const KvCacheShape& s) override {
    shape_ = s;
    // On 2 MiB pages like the weights (huge_page_arena.h; decode attention of 32 sequences x 512 keys
    // 1.03-1.13x on the Zen 4 VM). A new arena gives back a previous cache's memory. The pages are touched
    // here, as the zero-filled vectors before were, so that no step pays their first faults.
    kv_arena_ = std::make_unique<cpu::HugePageArena>();
    const std::size_t bytes = static_cast<std::size_t>(s.num_layers * s.num_blocks) * kv_block_bytes();
    cache_ = kv_arena_->take(bytes);
    std::memset(cache_, 0, bytes);
    // The transposed copy of K (cpu::KvLayer::kt): zero, as K is, so every block starts fresh.
    const cpu::KvLayer l{nullptr, kv_dtype_, s.block_size, s.num_kv_heads, s.head_dim};
    const std::size_t kt_bytes = static_cast<std::size_t>(s.num_layers * s.num_blocks * l.kt_block_elems()) * dtype_size(kv_dtype_);
    kt_ = kt_bytes ? kv_arena_->take(kt_bytes) : nullptr;
    if (kt_) std::memset(kt_, 0, kt_bytes);
    kt_fresh_.assign(static_cast<std::size_t>(s.num_layers * s.num_blocks), 1);
  }
  const KvCacheShape& kv_cache_shape() const override { return shape_; }
  DType kv_dtype() const override { return kv_dtype_; }
  void read_kv_block(std::int64_t layer, std::int64_t block, float* host) override {
    const cpu::KvLayer l = layer_view(layer);
    cpu::with_kv_type(kv_dtype_, [&](auto elem) {
      cpu::widen(l.at<decltype(elem)>(block * l.block_elems()), host, l.block_elems());
    });
  }
  void read_kv_bytes(std::int64_t layer, std::int64_t block, void* host) override {
    std::memcpy(host, block_bytes(layer, block), kv_block_bytes());
  }
  void write_kv_bytes(std::int64_t layer, std::int64_t block, const void* host) override {
    std::memcpy(block_bytes(layer, block), host, kv_block_bytes());
    kt_fresh_[static_cast<std::size_t>(layer * shape_.num_blocks + block)] = 0;
  }
  // A transfer may write the bytes behind this pointer (the decode side's pulls land there): the block's
  // transposed K is marked stale, and attention transposes it again before it next reads the block.
  ThreadPool* host_threads() override { return &pool_; }
  const void* kv_host_bytes(std::int64_t layer, std::int64_t block) const override {
    kt_fresh_[static_cast<std::size_t>(layer * shape_.num_blocks + block)] = 0;
    return cache_ + static_cast<std::size_t>(layer * shape_.num_blocks + block) * kv_block_bytes();
  }

  void embedding(DeviceWeight table, std::int64_t dim, const std::int32_t* ids, std::int64_t n, float* out) override {
    if (std::find(embedding_tables_.begin(), embedding_tables_.end(), table.data) == embedding_tables_.end())
      embedding_tables_.push_back(table.data);  // before any linear of the step: see release_plain
    cpu::embedding(ref(table), dim, ids, n, out);
  }
  void rms_norm(const float* x, std::int64_t rows, std::int64_t dim, DeviceWeight w, float eps, float* out) override {
    cpu::rms_norm(pool_, x, rows, dim, ref(w), eps, out);
  }
  void add_rms_norm(float* residual, const float* delta, std::int64_t rows, std::int64_t dim, DeviceWeight w,
                    float eps, float* out) override {
    cpu::add_rms_norm(pool_, residual, delta, rows, dim, ref(w), eps, out);
  }
  void linear(const float* x, std::int64_t rows, std::int64_t in, DeviceWeight w, std::int64_t out, DeviceWeight bias,
              float* y) override {
    cpu::linear(pool_, x, rows, in, packed(w, out, in), out, ref(bias), y);
  }
  void linear_multi(const float* x, std::int64_t rows, std::int64_t in, std::span<const LinearOut> parts) override {
    parts_.clear();  // one hand-off to the pool for all the parts (2-3 entries)
    for (const LinearOut& o : parts) parts_.push_back({packed(o.w, o.out, in), o.out, ref(o.bias), o.d_y});
    cpu::linear_multi(pool_, x, rows, in, parts_.data(), static_cast<std::int64_t>(parts_.size()));
  }
  void silu_mul(float* gate, const float* up, std::int64_t n) override { cpu::silu_mul(pool_, gate, up, n); }

  void rope_store_kv(std::int64_t layer, const float* inv_freq, float* q, const float* k, const float* v,
                     std::int64_t num_heads, const AttentionMeta& meta) override {
    cpu::rope_store_kv(pool_, {inv_freq, shape_.head_dim}, q, k, v, meta.rows, num_heads, meta.d_positions, meta.d_slots,
                       layer_view(layer));
  }
  void paged_attention(std::int64_t layer, const float* q, std::int64_t num_heads, const AttentionMeta& meta,
                       float scale, float* out) override {
    rows_.resize(static_cast<std::size_t>(meta.rows));
    for (std::int64_t r = 0; r < meta.rows; ++r)
      rows_[static_cast<std::size_t>(r)] = {meta.d_positions[r], meta.d_tables + meta.d_table_offsets[r]};
    cpu::paged_attention(pool_, q, meta.rows, num_heads, rows_.data(), layer_view(layer), scale, out);
  }

  void moe_route(const float* logits, std::int64_t rows, std::int64_t num_experts, std::int64_t top_k, bool renormalize,
                 std::int32_t* ids, float* weights) override {
    cpu::moe_route(logits, rows, num_experts, top_k, renormalize, ids, weights);
  }
  void moe_experts(const float* x, std::int64_t rows, std::int64_t hidden, const std::int32_t* ids, const float* weights,
                   std::int64_t top_k, const MoeExpertWeights& e, float* out, std::int32_t* counts) override {
    experts_.resize(static_cast<std::size_t>(e.num_experts));
    for (std::int64_t i = 0; i < e.num_experts; ++i)
      experts_[static_cast<std::size_t>(i)] = {packed(e.gate[i], e.intermediate, hidden), packed(e.up[i], e.intermediate, hidden),
                                               packed(e.down[i], hidden, e.intermediate)};
    cpu::moe_experts(pool_, moe_scratch_, x, rows, hidden, e.intermediate, ids, weights, top_k, experts_.data(),
                     e.num_experts, out, counts);
  }
  void sigmoid_scale_add(float* acc, const float* x, const float* gate, std::int64_t rows, std::int64_t dim) override {
    cpu::sigmoid_scale_add(acc, x, gate, rows, dim);
  }
  void gather_rows(const float* x, const std::int32_t* rows, std::int64_t n, std::int64_t dim, float* out) override {
    for (std::int64_t i = 0; i < n; ++i) std::memcpy(out + i * dim, x + rows[i] * dim, static_cast<std::size_t>(dim) * sizeof(float));
  }
  void moe_combine(const float* ys, const std::int32_t* position, const float* weights, std::int64_t rows,
                   std::int64_t top_k, std::int64_t hidden, float* out) override {
    cpu::moe_combine(ys, position, weights, rows, top_k, hidden, out);
  }

 private:
  cpu::KvLayer layer_view(std::int64_t layer) {
    cpu::KvLayer l{cache_ + static_cast<std::size_t>(layer * shape_.num_blocks) * kv_block_bytes(), kv_dtype_,
                   shape_.block_size, shape_.num_kv_heads, shape_.head_dim};
    if (kt_) {
      l.kt = kt_ + static_cast<std::size_t>(layer * shape_.num_blocks * l.kt_block_elems()) * dtype_size(kv_dtype_);
      l.kt_fresh = kt_fresh_.data() + static_cast<std::size_t>(layer * shape_.num_blocks);
    }
    return l;
  }
  std::byte* block_bytes(std::int64_t layer, std::int64_t block) {
    return cache_ + static_cast<std::size_t>(layer * shape_.num_blocks + block) * kv_block_bytes();
  }

  // A linear weight (MoE experts too) in pack_weight's layout (ops.h), made on its first use as a linear
  // weight (only the runner knows which weights are linear): the only copy the kernels then read, for
  // every row count (the GEMV reads the panels too, prefetched far ahead). Same bits as the plain weight.
  // The plain pages are handed back to the kernel (release_plain): the weights are not resident twice.
  // Without packing (pack_) the plain weights are read (no copy, no packing time at the first step).
  cpu::WeightRef packed(DeviceWeight w, std::int64_t out, std::int64_t in) {
    if (!pack_ || !w.data) return ref(w);  // (an expert another rank serves has no weights here)
    if (auto it = packed_.find(w.data); it != packed_.end()) return {nullptr, w.dtype, it->second};
    // Not zeroed first: pack_weight writes every byte. On 2 MiB pages where the kernel gives them
    // (huge_page_arena.h). THP was tried once before (commit 0010956, an earlier VM), where compaction stalls
    // made loading slower (1.3-4.2 s against 0.9 s); on the Zen 4 VM loading 1.6 GB took ~0.2 s longer
    // (docs/cpu_backend.md). KVFLEET_CPU_HUGEPAGES=0 turns it off.
    std::byte* p = arena_.take(cpu::packed_weight_bytes(out, in, w.dtype));  // 64-byte aligned: a bf16 block is a line
    cpu::pack_weight(w.data, w.dtype, out, in, p, &pool_);
    packed_.emplace(w.data, p);
    release_plain(w.data, static_cast<std::size_t>(out * in) * dtype_size(w.dtype));
    return {nullptr, w.dtype, p};
  }

  // The whole pages of a packed weight's plain copy, given back. The checkpoint is mapped read-only and
  // private from its file (engine/model/safetensors.cpp): there MADV_DONTNEED drops only this process's
  // view, the pages leave the resident set and stay in the page cache, so the next process that loads the
  // model reads them from memory, not from disk (MADV_PAGEOUT, used before, evicted them from the cache).
  // Memory that is not such a mapping (anonymous: a converted weight, a test's buffer) gets MADV_PAGEOUT,
  // which can only swap it out, never lose it (MADV_DONTNEED would zero it). A page shared with another
  // tensor is kept (the range is shrunk to whole pages inside the weight), and so is an embedding table (a
  // tied lm_head): embedding lookups keep reading its rows.
  void release_plain(const void* data, std::size_t bytes) {
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<std::uintptr_t>(data), end = begin + bytes;
    for (const void* table : embedding_tables_) {
      const auto t = reinterpret_cast<std::uintptr_t>(table);
      if (t >= begin && t < end) return;
    }
    const std::uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
    if (last <= first) return;
    const int advice = in_read_only_file_mapping(first, last) ? MADV_DONTNEED : MADV_PAGEOUT;
    ::madvise(reinterpret_cast<void*>(first), last - first, advice);  // a hint: errors ignored
  }

  ThreadPool pool_;
  // Packed by default where a vector kernel runs: the AVX-512 GEMV prefetches the panels' one stream far
  // ahead (1.04-1.18x plain rows' bandwidth on the Zen 5 VM), and the AVX2 GEMV reads a panel in two passes
  // (linear_avx2.cpp; on the Zen 3 VM 1.39x plain rows in a 125M decode at batch 1, docs/cpu_backend.md
  // docs/cpu_backend.md). The scalar fallback keeps the plain weights. KVFLEET_CPU_PACK=1 / 0 forces either (same bits).
  const bool pack_ = [] {
    const char* env = std::getenv("KVFLEET_CPU_PACK");
    if (env) return std::string_view(env) != "0";
    return cpu::cpu_isa() != cpu::Isa::scalar;
  }();
  std::vector<const void*> embedding_tables_;
  cpu::HugePageArena arena_;  // holds every packed weight, freed with the backend
  std::unordered_map<const void*, std::byte*> packed_;
  std::vector<cpu::LinearPart> parts_;
  DType kv_dtype_;
  KvCacheShape shape_;
  std::unique_ptr<cpu::HugePageArena> kv_arena_;  // holds cache_ and kt_
  std::byte* cache_ = nullptr;
  // K transposed per block (cpu::KvLayer::kt: decode attention reads it instead of transposing every block
  // every step), half as many bytes again as the cache; and per (layer, block) whether it matches K.
  std::byte* kt_ = nullptr;
  mutable std::vector<std::uint8_t> kt_fresh_;
  std::vector<cpu::AttnRow> rows_;
  std::vector<cpu::ExpertRef> experts_;
  cpu::MoeScratch moe_scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(unsigned threads, DType kv_dtype) {
  return std::make_unique<CpuBackend>(threads, kv_dtype);
}

}  // namespace kvfleet
