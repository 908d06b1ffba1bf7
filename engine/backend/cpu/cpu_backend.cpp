// The CPU backend: host memory, the kernels of kernels/cpu, fp32 KV cache.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/ops.h"
#include "kvfleet/backend.h"

namespace kvfleet {
namespace {

cpu::WeightRef ref(DeviceWeight w) { return {w.data, w.dtype}; }

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(unsigned threads) : pool_(threads) {}

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
    cache_.assign(static_cast<std::size_t>(s.num_layers * s.num_blocks * s.block_elems()), 0.0f);
  }
  const KvCacheShape& kv_cache_shape() const override { return shape_; }
  void read_kv_block(std::int64_t layer, std::int64_t block, float* host) override {
    const auto n = static_cast<std::size_t>(shape_.block_elems());
    std::memcpy(host, layer_view(layer).base + block * shape_.block_elems(), n * sizeof(float));
  }
  void read_kv_bytes(std::int64_t layer, std::int64_t block, void* host) override {
    read_kv_block(layer, block, static_cast<float*>(host));
  }
  void write_kv_bytes(std::int64_t layer, std::int64_t block, const void* host) override {
    const auto n = static_cast<std::size_t>(shape_.block_elems());
    std::memcpy(layer_view(layer).base + block * shape_.block_elems(), host, n * sizeof(float));
  }

  void embedding(DeviceWeight table, std::int64_t dim, const std::int32_t* ids, std::int64_t n, float* out) override {
    cpu::embedding(ref(table), dim, ids, n, out);
  }
  void rms_norm(const float* x, std::int64_t rows, std::int64_t dim, DeviceWeight w, float eps, float* out) override {
    cpu::rms_norm(x, rows, dim, ref(w), eps, out);
  }
  void add_rms_norm(float* residual, const float* delta, std::int64_t rows, std::int64_t dim, DeviceWeight w,
                    float eps, float* out) override {
    cpu::add_rms_norm(residual, delta, rows, dim, ref(w), eps, out);
  }
  void linear(const float* x, std::int64_t rows, std::int64_t in, DeviceWeight w, std::int64_t out, DeviceWeight bias,
              float* y) override {
    cpu::linear(pool_, x, rows, in, ref(w), out, ref(bias), y);
  }
  void linear_multi(const float* x, std::int64_t rows, std::int64_t in, std::span<const LinearOut> parts) override {
    std::vector<cpu::LinearPart> p;  // one hand-off to the pool for all the parts (2-3 entries)
    for (const LinearOut& o : parts) p.push_back({ref(o.w), o.out, ref(o.bias), o.d_y});
    cpu::linear_multi(pool_, x, rows, in, p.data(), static_cast<std::int64_t>(p.size()));
  }
  void silu_mul(float* gate, const float* up, std::int64_t n) override { cpu::silu_mul(gate, up, n); }

  void rope_store_kv(std::int64_t layer, const float* inv_freq, float* q, const float* k, const float* v,
                     std::int64_t num_heads, const AttentionMeta& meta) override {
    cpu::rope_store_kv({inv_freq, shape_.head_dim}, q, k, v, meta.rows, num_heads, meta.d_positions, meta.d_slots,
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
      experts_[static_cast<std::size_t>(i)] = {ref(e.gate[i]), ref(e.up[i]), ref(e.down[i])};
    cpu::moe_experts(pool_, moe_scratch_, x, rows, hidden, e.intermediate, ids, weights, top_k, experts_.data(),
                     e.num_experts, out, counts);
  }
  void sigmoid_scale_add(float* acc, const float* x, const float* gate, std::int64_t rows, std::int64_t dim) override {
    cpu::sigmoid_scale_add(acc, x, gate, rows, dim);
  }

 private:
  cpu::KvLayer layer_view(std::int64_t layer) {
    return {cache_.data() + layer * shape_.num_blocks * shape_.block_elems(), shape_.block_size, shape_.num_kv_heads,
            shape_.head_dim};
  }

  ThreadPool pool_;
  KvCacheShape shape_;
  std::vector<float> cache_;
  std::vector<cpu::AttnRow> rows_;
  std::vector<cpu::ExpertRef> experts_;
  cpu::MoeScratch moe_scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(unsigned threads) {
  auto backend = std::make_unique<CpuBackend>(threads);
  static std::once_flag once;  // the kernels' path is chosen once per process: say it once
  std::call_once(once, [] {
    std::fprintf(stderr, "kvfleet: info: cpu kernels: %s\n", std::string(cpu::isa_name(cpu::cpu_isa())).c_str());
  });
  return backend;
}

}  // namespace kvfleet
