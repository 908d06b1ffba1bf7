#include <stdexcept>
#include <string>

#include "kvfleet/backend.h"

#ifdef KVFLEET_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

namespace kvfleet {

std::optional<DType> parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return std::nullopt;
  if (name == "float32" || name == "fp32") return DType::f32;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  if (name == "float16" || name == "fp16") return DType::f16;
  throw std::invalid_argument("kv_cache_dtype '" + std::string(name) + "' (use auto, float32, bfloat16 or float16)");
}

namespace {

std::unique_ptr<Backend> make_cpu(const BackendOptions& options) {
  return make_cpu_backend(options.threads, parse_kv_cache_dtype(options.kv_cache_dtype).value_or(DType::f32));
}

}  // namespace

std::string_view chosen_backend_kind(const BackendOptions& options) {
  if (options.kind == "cpu") return "cpu";
  if (options.kind == "cuda") return "cuda";
  if (options.kind != "auto")
    throw std::invalid_argument("unknown backend '" + options.kind + "' (use cpu, cuda or auto)");
#ifdef KVFLEET_HAVE_CUDA
  return cuda_device_count() > 0 ? "cuda" : "cpu";
#else
  return "cpu";
#endif
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (chosen_backend_kind(options) == "cpu") return make_cpu(options);
#ifdef KVFLEET_HAVE_CUDA
  return make_cuda_backend(options);  // throws "no CUDA device found: ..."
#else
  throw std::runtime_error(
      "--backend cuda: no CUDA device found: this build has no CUDA backend "
      "(configure with -DKVFLEET_CUDA=ON)");
#endif
}

}  // namespace kvfleet
