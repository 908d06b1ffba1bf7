// The narrow interface between the model runner and a device (docs/architecture.md, Contract 5). The runner owns the
// order of operations; a backend owns memory and kernels. Pointers named d_* are device memory of this
// backend (host memory for the CPU backend). Activations are fp32; weights keep the checkpoint dtype.
// Thread-safety: a backend is used by one thread at a time (the engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvfleet/dtype.h"
#include "kvfleet/safetensors.h"

namespace kvfleet {

class ThreadPool;

struct DeviceWeight {
  const void* data = nullptr;  // null: absent (an optional bias)
  DType dtype = DType::f32;
};

// Where each row of a step reads and writes the paged cache. All arrays are device memory.
struct AttentionMeta {
  std::int64_t rows = 0;
  const std::int32_t* d_positions = nullptr;     // [rows] position of the row in its sequence
  const std::int64_t* d_slots = nullptr;         // [rows] cache slot: block * block_size + offset
  const std::int32_t* d_table_offsets = nullptr; // [rows] start of the row's block table in d_tables
  const std::int32_t* d_tables = nullptr;        // block tables of all sequences, concatenated
  // Host copy of max(positions) when the caller knows it (-1: unknown). Lets a device backend size its
  // launch without reading d_positions back; the CPU backend ignores it.
  std::int32_t max_position = -1;
  // Host count of the sequences the rows belong to (-1: unknown). Rows per sequence tell a device backend
  // whether the step is prefill-heavy (a tensor-core prefill kernel pays) or decode rows.
  std::int32_t num_seqs = -1;
};

struct KvCacheShape {
  std::int64_t num_layers = 0, num_blocks = 0, block_size = 16, num_kv_heads = 0, head_dim = 0;
  std::int64_t block_elems() const { return 2 * num_kv_heads * block_size * head_dim; }  // one layer, K+V
};

// The experts of one MoE layer, for Backend::moe_experts: num_experts weights each (host arrays of device
// weights), expert e's MLP being down(silu(gate(x)) * up(x)) with `intermediate` hidden features.
struct MoeExpertWeights {
  const DeviceWeight* gate = nullptr;
  const DeviceWeight* up = nullptr;
  const DeviceWeight* down = nullptr;
  std::int64_t num_experts = 0;
  std::int64_t intermediate = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* d_ptr) = 0;
  virtual void to_device(void* d_dst, const void* src, std::size_t bytes) = 0;
  virtual void to_host(void* dst, const void* d_src, std::size_t bytes) = 0;
  // Makes a weight usable by the kernels. The CPU backend reads the mapped checkpoint in place.
  virtual DeviceWeight upload_weight(const TensorView& t) = 0;

  // The paged KV cache: one buffer, per layer, per block, K then V, each [kv_heads][block_size][head_dim].
  virtual void allocate_kv_cache(const KvCacheShape& shape) = 0;
  virtual const KvCacheShape& kv_cache_shape() const = 0;
  // Copies one block of one layer (K then V, fp32) to or from host memory, for tests and KV transfer.
  virtual void read_kv_block(std::int64_t layer, std::int64_t block, float* host) = 0;
  // KV transfer (Contract 3): one block of one layer as stored (K then V, in kv_dtype()), to or from host
  // memory; kv_block_bytes() bytes each. The bytes are what prefill and decode replicas ship to each other.
  virtual DType kv_dtype() const { return DType::f32; }
  std::size_t kv_block_bytes() const {
    return static_cast<std::size_t>(kv_cache_shape().block_elems()) * dtype_size(kv_dtype());
  }
  virtual void read_kv_bytes(std::int64_t layer, std::int64_t block, void* host) = 0;
  virtual void write_kv_bytes(std::int64_t layer, std::int64_t block, const void* host) = 0;
  // Where one block of one layer lies in host memory (kv_block_bytes() bytes, as read_kv_bytes copies
  // them), or nullptr when the cache is not host memory (CUDA). KV transfer sends from there without a
  // copy; the caller keeps the block pinned while it reads and must not write it, unless the block is one
  // it reserved (KvCacheManager::reserve_block: pinned, in no table and no prefix-cache entry, so no step
  // reads it): a decode replica reads the network straight into those before entering them.
  virtual const void* kv_host_bytes(std::int64_t /*layer*/, std::int64_t /*block*/) const { return nullptr; }
  // The host threads the backend's kernels run on (CPU), or nullptr (CUDA). The engine samples a step's rows
  // on them between forwards, so a CPU replica keeps one pool of threads, not two.
  virtual ThreadPool* host_threads() { return nullptr; }
  // Several whole blocks (every layer) to or from host memory laid out [block][layer] (K then V each), the
  // unit of KV transfer; block i's bytes start at host + i * stride (0: packed, back to back), so they can
  // land straight in wire frames. These defaults loop over read/write_kv_bytes; the CUDA backend stages
  // through a pinned host buffer with every copy queued on its stream before one synchronize.
  virtual void read_kv_blocks(std::span<const std::int32_t> blocks, void* host, std::size_t stride = 0) {
    const std::size_t layer_bytes = kv_block_bytes(), layers = static_cast<std::size_t>(kv_cache_shape().num_layers);
    if (stride == 0) stride = layer_bytes * layers;
    for (std::size_t i = 0; i < blocks.size(); ++i)
      for (std::size_t l = 0; l < layers; ++l)
        read_kv_bytes(static_cast<std::int64_t>(l), blocks[i], static_cast<char*>(host) + i * stride + l * layer_bytes);
  }
  virtual void write_kv_blocks(std::span<const std::int32_t> blocks, const void* host, std::size_t stride = 0) {
    const std::size_t layer_bytes = kv_block_bytes(), layers = static_cast<std::size_t>(kv_cache_shape().num_layers);
    if (stride == 0) stride = layer_bytes * layers;
    for (std::size_t i = 0; i < blocks.size(); ++i)
      for (std::size_t l = 0; l < layers; ++l)
        write_kv_bytes(static_cast<std::int64_t>(l), blocks[i], static_cast<const char*>(host) + i * stride + l * layer_bytes);
  }

  virtual void embedding(DeviceWeight table, std::int64_t dim, const std::int32_t* d_ids, std::int64_t n,
                         float* d_out) = 0;
  virtual void rms_norm(const float* d_x, std::int64_t rows, std::int64_t dim, DeviceWeight w, float eps,
                        float* d_out) = 0;
  virtual void add_rms_norm(float* d_residual, const float* d_delta, std::int64_t rows, std::int64_t dim,
                            DeviceWeight w, float eps, float* d_out) = 0;
  virtual void linear(const float* d_x, std::int64_t rows, std::int64_t in, DeviceWeight w, std::int64_t out,
                      DeviceWeight bias, float* d_y) = 0;
  // Several projections of the same x (Q/K/V, gate/up) as one op where the backend can fuse them; each
  // part's result must equal its own linear() bit for bit. The default runs them one by one.
  struct LinearOut {
    DeviceWeight w;
    std::int64_t out = 0;
    DeviceWeight bias;
    float* d_y = nullptr;
  };
  virtual void linear_multi(const float* d_x, std::int64_t rows, std::int64_t in, std::span<const LinearOut> parts) {
    for (const LinearOut& p : parts) linear(d_x, rows, in, p.w, p.out, p.bias, p.d_y);
  }
  virtual void silu_mul(float* d_gate, const float* d_up, std::int64_t n) = 0;
  // Rotates q in place and k, and writes k and v of every row into the layer's cache slots.
  virtual void rope_store_kv(std::int64_t layer, const float* d_inv_freq, float* d_q, const float* d_k,
                             const float* d_v, std::int64_t num_heads, const AttentionMeta& meta) = 0;
  virtual void paged_attention(std::int64_t layer, const float* d_q, std::int64_t num_heads,
                               const AttentionMeta& meta, float scale, float* d_out) = 0;

  // Mixture of experts (kernels/cpu/moe.h is the reference). A backend without them throws
  // std::runtime_error naming itself; the dense path never calls them.
  // Per row: softmax of the router logits (fp32), the top_k experts in descending probability (ties: lower
  // id) with their probabilities, renormalised to sum 1 when asked.
  virtual void moe_route(const float* d_logits, std::int64_t rows, std::int64_t num_experts, std::int64_t top_k,
                         bool renormalize, std::int32_t* d_ids, float* d_weights);
  // d_out[r] = sum over j < top_k, in rank order, of d_weights[r][j] * expert_{d_ids[r][j]}(d_x[r]); tokens
  // grouped by expert, one GEMM per expert and projection. d_counts (may be null): += rows per expert.
  virtual void moe_experts(const float* d_x, std::int64_t rows, std::int64_t hidden, const std::int32_t* d_ids,
                           const float* d_weights, std::int64_t top_k, const MoeExpertWeights& experts, float* d_out,
                           std::int32_t* d_counts);
  // d_acc[r][:] += sigmoid(d_gate[r]) * d_x[r][:] (Qwen2-MoE's gated shared expert).
  virtual void sigmoid_scale_add(float* d_acc, const float* d_x, const float* d_gate, std::int64_t rows,
                                 std::int64_t dim);
  // Expert parallelism on device memory (MoeLayers with a device communicator such as NCCL; defaults
  // throw like the MoE ops). d_out[i][:] = d_x[d_rows[i]][:] for i < n.
  virtual void gather_rows(const float* d_x, const std::int32_t* d_rows, std::int64_t n, std::int64_t dim,
                           float* d_out);
  // The combine step alone: d_out[r][:] = sum over j < top_k, in rank order, of d_weights[r][j] *
  // d_ys[d_position[r * top_k + j]][:] (what moe_experts ends with, so results match it bit for bit).
  virtual void moe_combine(const float* d_ys, const std::int32_t* d_position, const float* d_weights,
                           std::int64_t rows, std::int64_t top_k, std::int64_t hidden, float* d_out);
  // The stream every op of this backend runs on (a cudaStream_t), for a communicator that queues its
  // exchange behind them; null where there is none (the CPU backend).
  virtual void* stream_handle() { return nullptr; }

  virtual void synchronize() {}
  // How many KV blocks of `shape` (num_blocks ignored) fit in the memory this backend may give the cache:
  // a fraction of free device memory for CUDA; 0 when the backend sets no limit (the CPU).
  virtual std::int64_t kv_blocks_that_fit(const KvCacheShape& shape) const {
    (void)shape;
    return 0;
  }
};

struct BackendOptions {
  std::string kind = "auto";  // cpu | cuda | auto
  unsigned threads = 0;       // CPU threads; 0 = all cores
  // CUDA: our own GEMM, whose result for a row does not depend on the other rows of the batch (the
  // engine's equivalence guarantee); false: cuBLAS on bf16/f16-rounded activations (faster, not invariant).
  bool batch_invariant = true;
  double kv_memory_fraction = 0.9;  // CUDA: share of free device memory kv_blocks_that_fit may use
  int device = 0;                   // CUDA device ordinal
  // The KV cache's element type, as vLLM's --kv-cache-dtype: auto (CPU: float32; CUDA: bf16 for a 16-bit
  // checkpoint, else f32), float32, bfloat16 or float16. Arithmetic is fp32 in every case.
  std::string kv_cache_dtype = "auto";
};

// "auto" -> nullopt; float32/bfloat16/float16 (also fp32/bf16/fp16) -> the dtype; anything else throws
// std::invalid_argument naming the option.
std::optional<DType> parse_kv_cache_dtype(std::string_view name);

// The kind of backend make_backend(options) makes: "cpu" or "cuda"; "auto" is CUDA when this build has it
// and a GPU is present, else the CPU. Throws std::invalid_argument for an unknown kind.
std::string_view chosen_backend_kind(const BackendOptions& options);
// Makes the backend chosen_backend_kind(options) names.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
std::unique_ptr<Backend> make_cpu_backend(unsigned threads, DType kv_dtype = DType::f32);
// Only in builds with KVFLEET_CUDA; throws std::runtime_error("no CUDA device found: ...") without a GPU.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace kvfleet
