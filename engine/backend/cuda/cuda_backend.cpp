// The CUDA backend: weights on the GPU in the checkpoint dtype, fp32 activations, a paged KV cache in
// bf16 (f32 for f32 models) with the CPU's block layout, the kernels of kernels/cuda, and linear layers
// either through our batch-invariant GEMM (the default; the engine's equivalence guarantee) or cuBLAS.
// Everything runs on one stream owned by the backend; to_host and synchronize wait for it.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "kvfleet/backend.h"

namespace kvfleet {
namespace {

void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(call) + " failed: " + cublasGetStatusName(s) + " (" +
                             cublasGetStatusString(s) + ")");
}
#define KVF_CUBLAS(call) check_cublas((call), #call)

cuda::WeightRef ref(DeviceWeight w) { return {w.data, w.dtype}; }

cudaDataType_t cublas_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// A device buffer that only grows; for per-call scratch (cuBLAS inputs, attention partitions).
struct Growable {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  void* reserve(std::size_t n) {
    if (n <= bytes) return ptr;
    if (ptr) KVF_CUDA(cudaFree(ptr));
    ptr = nullptr;
    bytes = 0;
    KVF_CUDA(cudaMalloc(&ptr, n));
    bytes = n;
    return ptr;
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& o) : options_(o) {
    KVF_CUDA(cudaSetDevice(o.device));
    KVF_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KVF_CUBLAS(cublasCreate(&cublas_));
    KVF_CUBLAS(cublasSetStream(cublas_, stream_));
  }
  ~CudaBackend() override {
    // Destructors must not throw: report failures instead.
    report(cudaSetDevice(options_.device), "cudaSetDevice");
    report(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    for (void* p : weights_) report(cudaFree(p), "cudaFree(weight)");
    for (void* p : {cache_, half_x_.ptr, attn_ws_.ptr, moe_ws_.ptr, moe_ptrs_.ptr})
      if (p) report(cudaFree(p), "cudaFree(scratch)");
    if (staging_) report(cudaFreeHost(staging_), "cudaFreeHost(staging)");
    if (cublas_) cublasDestroy(cublas_);
    report(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }

  std::string_view name() const override { return "cuda"; }

  void* allocate(std::size_t bytes) override {
    bind();
    void* p = nullptr;
    KVF_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)));
    return p;
  }
  void deallocate(void* p) override {
    bind();
    report(cudaFree(p), "cudaFree");
  }
  // The host buffer may be reused once this returns: pageable copies are staged before returning.
  void to_device(void* dst, const void* src, std::size_t n) override {
    bind();
    if (n) KVF_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_));
  }
  void to_host(void* dst, const void* src, std::size_t n) override {
    bind();
    if (n) KVF_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  DeviceWeight upload_weight(const TensorView& t) override {
    bind();
    void* p = allocate(t.bytes());
    weights_.push_back(p);
    KVF_CUDA(cudaMemcpy(p, t.data, t.bytes(), cudaMemcpyHostToDevice));
    if (t.dtype != DType::f32) half_weights_ = true;
    return {p, t.dtype};
  }

  // bf16 for bf16/f16 checkpoints, f32 for f32 ones (their logits are compared with transformers at 1e-4).
  DType kv_dtype() const override { return half_weights_ ? DType::bf16 : DType::f32; }

  void allocate_kv_cache(const KvCacheShape& s) override {
    bind();
    if (cache_) KVF_CUDA(cudaFree(cache_));
    cache_ = nullptr;
    shape_ = s;
    const std::size_t bytes = cache_bytes_per_block(s) * static_cast<std::size_t>(s.num_blocks);
    KVF_CUDA(cudaMalloc(&cache_, std::max<std::size_t>(bytes, 1)));
    KVF_CUDA(cudaMemsetAsync(cache_, 0, bytes, stream_));
  }
  const KvCacheShape& kv_cache_shape() const override { return shape_; }
  std::int64_t kv_blocks_that_fit(const KvCacheShape& s) const override {
    bind();
    std::size_t free = 0, total = 0;
    KVF_CUDA(cudaMemGetInfo(&free, &total));
    return static_cast<std::int64_t>(static_cast<double>(free) * options_.kv_memory_fraction /
                                     static_cast<double>(cache_bytes_per_block(s)));
  }
  void read_kv_block(std::int64_t layer, std::int64_t block, float* host) override {
    bind();
    const cuda::KvLayer l = layer_view(layer);
    const auto n = static_cast<std::size_t>(shape_.block_elems());
    const std::size_t elem = dtype_size(l.dtype);
    std::vector<std::uint16_t> raw(l.dtype == DType::f32 ? 0 : n);
    void* dst = l.dtype == DType::f32 ? static_cast<void*>(host) : raw.data();
    to_host(dst, static_cast<const char*>(l.base) + static_cast<std::size_t>(block) * n * elem, n * elem);
    for (std::size_t i = 0; i < raw.size(); ++i) host[i] = bf16_to_f32(raw[i]);
  }
  // Raw bytes as stored (bf16 or f32), synchronous: the host buffer is valid when the call returns.
  void read_kv_bytes(std::int64_t layer, std::int64_t block, void* host) override {
    bind();
    const std::size_t bytes = kv_block_bytes();
    const cuda::KvLayer l = layer_view(layer);
    to_host(host, static_cast<const char*>(l.base) + static_cast<std::size_t>(block) * bytes, bytes);
    synchronize();
  }
  void write_kv_bytes(std::int64_t layer, std::int64_t block, const void* host) override {
    bind();
    const std::size_t bytes = kv_block_bytes();
    const cuda::KvLayer l = layer_view(layer);
    to_device(static_cast<char*>(l.base) + static_cast<std::size_t>(block) * bytes, host, bytes);
    synchronize();  // the caller may reuse its buffer at once
  }
  // KV transfer's staging path: every (block, layer) copy is queued on the stream into one pinned buffer,
  // then a single synchronize; the engine/pd pipeline overlaps this with sending the previous batch.
  void read_kv_blocks(std::span<const std::int32_t> blocks, void* host, std::size_t stride = 0) override {
    bind();
    const std::size_t bytes = kv_block_bytes(), layers = static_cast<std::size_t>(shape_.num_layers);
    const std::size_t block_bytes = layers * bytes;
    char* pinned = staging(blocks.size() * block_bytes);
    for (std::size_t i = 0; i < blocks.size(); ++i)
      for (std::size_t l = 0; l < layers; ++l)
        KVF_CUDA(cudaMemcpyAsync(pinned + (i * layers + l) * bytes, block_ptr(l, blocks[i]), bytes, cudaMemcpyDeviceToHost,
                                 stream_));
    synchronize();
    if (stride == 0 || stride == block_bytes) {
      std::memcpy(host, pinned, blocks.size() * block_bytes);
    } else {
      for (std::size_t i = 0; i < blocks.size(); ++i)
        std::memcpy(static_cast<char*>(host) + i * stride, pinned + i * block_bytes, block_bytes);
    }
  }
  void write_kv_blocks(std::span<const std::int32_t> blocks, const void* host, std::size_t stride = 0) override {
    bind();
    const std::size_t bytes = kv_block_bytes(), layers = static_cast<std::size_t>(shape_.num_layers);
    const std::size_t block_bytes = layers * bytes;
    if (stride == 0) stride = block_bytes;
    char* pinned = staging(blocks.size() * block_bytes);
    for (std::size_t i = 0; i < blocks.size(); ++i)
      std::memcpy(pinned + i * block_bytes, static_cast<const char*>(host) + i * stride, block_bytes);
    for (std::size_t i = 0; i < blocks.size(); ++i)
      for (std::size_t l = 0; l < layers; ++l)
        KVF_CUDA(cudaMemcpyAsync(block_ptr(l, blocks[i]), pinned + (i * layers + l) * bytes, bytes, cudaMemcpyHostToDevice,
                                 stream_));
    synchronize();
  }

  void embedding(DeviceWeight table, std::int64_t dim, const std::int32_t* ids, std::int64_t n, float* out) override {
    bind();
    cuda::embedding(ref(table), dim, ids, n, out, stream_);
  }
  void rms_norm(const float* x, std::int64_t rows, std::int64_t dim, DeviceWeight w, float eps, float* out) override {
    bind();
    cuda::rms_norm(x, rows, dim, ref(w), eps, out, stream_);
  }
  void add_rms_norm(float* residual, const float* delta, std::int64_t rows, std::int64_t dim, DeviceWeight w, float eps,
                    float* out) override {
    bind();
    cuda::add_rms_norm(residual, delta, rows, dim, ref(w), eps, out, stream_);
  }
  void linear(const float* x, std::int64_t rows, std::int64_t in, DeviceWeight w, std::int64_t out, DeviceWeight bias,
              float* y) override {
    bind();
    if (options_.batch_invariant) return cuda::linear(x, rows, in, ref(w), out, ref(bias), y, stream_);
    cublas_linear(x, rows, in, w, out, y);
    cuda::add_bias(y, rows, out, ref(bias), stream_);
  }
  void silu_mul(float* gate, const float* up, std::int64_t n) override {
    bind();
    cuda::silu_mul(gate, up, n, stream_);
  }
  void rope_store_kv(std::int64_t layer, const float* inv_freq, float* q, const float* k, const float* v,
                     std::int64_t num_heads, const AttentionMeta& meta) override {
    bind();
    cuda::rope_store_kv(inv_freq, q, k, v, meta.rows, num_heads, meta.d_positions, meta.d_slots, layer_view(layer),
                        stream_);
  }
  void paged_attention(std::int64_t layer, const float* q, std::int64_t num_heads, const AttentionMeta& meta,
                       float scale, float* out) override {
    bind();
    if (meta.rows == 0) return;
    cuda::AttentionArgs a;
    a.q = q;
    a.rows = meta.rows;
    a.num_heads = num_heads;
    a.positions = meta.d_positions;
    a.table_offsets = meta.d_table_offsets;
    a.tables = meta.d_tables;
    a.max_position = meta.max_position >= 0 ? meta.max_position : read_max_position(meta);
    a.scale = scale;
    a.out = out;
    const cuda::KvLayer cache = layer_view(layer);
    // Tensor cores for prefill-heavy steps (16-row tiles pay from ~4 rows per sequence), in the fast mode
    // only: the flash kernel's sums depend on the tile, so the invariant mode keeps the partitioned one.
    if (!options_.batch_invariant && meta.num_seqs > 0 && meta.rows >= 4 * std::int64_t{meta.num_seqs} &&
        cuda::prefill_attention_supported(cache))
      return cuda::prefill_attention(a, cache, stream_);
    void* ws =
        attn_ws_.reserve(cuda::paged_attention_workspace_bytes(meta.rows, num_heads, shape_.head_dim, a.max_position));
    cuda::paged_attention(a, cache, ws, stream_);
  }
  void moe_route(const float* logits, std::int64_t rows, std::int64_t num_experts, std::int64_t top_k, bool renormalize,
                 std::int32_t* ids, float* weights) override {
    bind();
    cuda::moe_route(logits, rows, num_experts, top_k, renormalize, ids, weights, stream_);
  }
  void moe_experts(const float* x, std::int64_t rows, std::int64_t hidden, const std::int32_t* ids, const float* weights,
                   std::int64_t top_k, const MoeExpertWeights& e, float* out, std::int32_t* counts) override;
  void sigmoid_scale_add(float* acc, const float* x, const float* gate, std::int64_t rows, std::int64_t dim) override {
    bind();
    cuda::sigmoid_scale_add(acc, x, gate, rows, dim, stream_);
  }
  void gather_rows(const float* x, const std::int32_t* rows, std::int64_t n, std::int64_t dim, float* out) override {
    bind();
    cuda::gather_rows(x, rows, n, dim, out, stream_);
  }
  void moe_combine(const float* ys, const std::int32_t* position, const float* weights, std::int64_t rows,
                   std::int64_t top_k, std::int64_t hidden, float* out) override {
    bind();
    cuda::moe_combine(ys, position, weights, rows, top_k, hidden, out, stream_);
  }
  void* stream_handle() override { return stream_; }
  void synchronize() override {
    bind();
    KVF_CUDA(cudaStreamSynchronize(stream_));
  }

 private:
  // The device is per thread in CUDA: the engine builds its backend on one thread and runs it on its own,
  // and a process may hold backends of several devices (expert-parallel ranks as threads). Every entry
  // point makes this backend's device current first (cheap when it already is).
  void bind() const { KVF_CUDA(cudaSetDevice(options_.device)); }
  char* block_ptr(std::size_t layer, std::int32_t block) const {
    return static_cast<char*>(layer_view(static_cast<std::int64_t>(layer)).base) + static_cast<std::size_t>(block) * kv_block_bytes();
  }
  // The pinned host buffer of read/write_kv_blocks; only grows.
  char* staging(std::size_t n) {
    if (n > staging_bytes_) {
      if (staging_) KVF_CUDA(cudaFreeHost(staging_));
      staging_ = nullptr;
      staging_bytes_ = 0;
      KVF_CUDA(cudaMallocHost(&staging_, n));
      staging_bytes_ = n;
    }
    return static_cast<char*>(staging_);
  }

  static void report(cudaError_t e, const char* call) {
    if (e != cudaSuccess) std::fprintf(stderr, "kvfleet cuda: %s failed: %s\n", call, cudaGetErrorString(e));
  }

  std::size_t cache_bytes_per_block(const KvCacheShape& s) const {
    return static_cast<std::size_t>(s.num_layers * s.block_elems()) * dtype_size(kv_dtype());
  }

  cuda::KvLayer layer_view(std::int64_t layer) const {
    const std::size_t layer_bytes =
        static_cast<std::size_t>(shape_.num_blocks * shape_.block_elems()) * dtype_size(kv_dtype());
    return {static_cast<char*>(cache_) + static_cast<std::size_t>(layer) * layer_bytes, kv_dtype(), shape_.block_size,
            shape_.num_kv_heads, shape_.head_dim};
  }

  // Callers outside ModelRunner may leave AttentionMeta::max_position unset: read the positions back.
  std::int32_t read_max_position(const AttentionMeta& meta) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(meta.rows));
    to_host(pos.data(), meta.d_positions, pos.size() * sizeof(std::int32_t));
    return *std::max_element(pos.begin(), pos.end());
  }

  // y = x w^T through cuBLAS: x rounded to the weight's 16-bit type (f32 weights: plain fp32 GEMM), fp32
  // output and accumulation. Column-major view: y^T [out x rows] = W [out x in] . x^T [in x rows].
  void cublas_linear(const float* x, std::int64_t rows, std::int64_t in, DeviceWeight w, std::int64_t out, float* y) {
    const void* b = x;
    if (w.dtype != DType::f32) {
      void* xh = half_x_.reserve(static_cast<std::size_t>(rows * in) * 2);
      cuda::f32_to_half(x, rows * in, w.dtype, xh, stream_);
      b = xh;
    }
    const float one = 1.0f, zero = 0.0f;
    KVF_CUBLAS(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(rows),
                            static_cast<int>(in), &one, w.data, cublas_type(w.dtype), static_cast<int>(in), b,
                            cublas_type(w.dtype), static_cast<int>(in), &zero, y, CUDA_R_32F, static_cast<int>(out),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  BackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::vector<void*> weights_;
  bool half_weights_ = false;
  KvCacheShape shape_;
  void* cache_ = nullptr;
  void* staging_ = nullptr;  // pinned host memory for KV transfer (read/write_kv_blocks)
  std::size_t staging_bytes_ = 0;
  Growable half_x_, attn_ws_, moe_ws_, moe_ptrs_;
};

// route -> align (group by expert) -> grouped GEMMs gate and up -> silu_mul -> grouped GEMM down ->
// combine, all on the stream; no host round trip (the slot count is rows * top_k, known on the host).
void CudaBackend::moe_experts(const float* x, std::int64_t rows, std::int64_t hidden, const std::int32_t* ids,
                              const float* weights, std::int64_t top_k, const MoeExpertWeights& e, float* out,
                              std::int32_t* counts) {
  bind();
  if (rows == 0) return;
  const std::int64_t pairs = rows * top_k, inter = e.intermediate, n = e.num_experts;
  auto align = [](std::size_t b) { return (b + 255) / 256 * 256; };
  const std::size_t ints = align(static_cast<std::size_t>(n + 1 + 2 * pairs) * sizeof(std::int32_t));
  const std::size_t floats = static_cast<std::size_t>(2 * pairs * inter + pairs * hidden) * sizeof(float);
  auto* base = static_cast<char*>(moe_ws_.reserve(ints + floats));
  auto* offsets = reinterpret_cast<std::int32_t*>(base);
  std::int32_t* position = offsets + n + 1;
  std::int32_t* source = position + pairs;
  auto* g = reinterpret_cast<float*>(base + ints);
  float* u = g + pairs * inter;
  float* ys = u + pairs * inter;
  // The experts' weight pointers, uploaded per call: stream-ordered after the previous layer's kernels, and
  // pageable copies are staged before to_device returns.
  std::vector<const void*> ptrs;
  for (const DeviceWeight* w : {e.gate, e.up, e.down})
    for (std::int64_t i = 0; i < n; ++i) ptrs.push_back(w[i].data);
  auto* d_ptrs = static_cast<const void**>(moe_ptrs_.reserve(ptrs.size() * sizeof(void*)));
  to_device(d_ptrs, ptrs.data(), ptrs.size() * sizeof(void*));
  const DType dt = e.gate[0].dtype;
  cuda::moe_align(ids, pairs, top_k, n, offsets, position, source, counts, stream_);
  cuda::moe_grouped_linear(x, source, pairs, hidden, d_ptrs, dt, n, offsets, inter, g, stream_);
  cuda::moe_grouped_linear(x, source, pairs, hidden, d_ptrs + n, dt, n, offsets, inter, u, stream_);
  cuda::silu_mul(g, u, pairs * inter, stream_);
  cuda::moe_grouped_linear(g, nullptr, pairs, inter, d_ptrs + 2 * n, dt, n, offsets, hidden, ys, stream_);
  cuda::moe_combine(ys, position, weights, rows, top_k, hidden, out, stream_);
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  const CudaProbe probe = cuda_probe();
  if (probe.devices == 0) throw std::runtime_error("no CUDA device found: " + probe.error);
  if (options.device < 0 || options.device >= probe.devices)
    throw std::runtime_error("CUDA device " + std::to_string(options.device) + " does not exist (" +
                             std::to_string(probe.devices) + " found)");
  return std::make_unique<CudaBackend>(options);
}

}  // namespace kvfleet
