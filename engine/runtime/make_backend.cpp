#include <stdexcept>

#include "kvfleet/backend.h"

namespace kvfleet {

#ifdef KVFLEET_HAVE_CUDA
int cuda_device_count();  // kernels/cuda/device_info.cu
#endif

namespace {

int device_count() {
#ifdef KVFLEET_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

}  // namespace

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  // "auto" means CUDA when a GPU is present; until the CUDA backend exists (issue 5) that is always the CPU.
  if (options.kind == "cpu" || options.kind == "auto") return make_cpu_backend(options.threads);
  if (options.kind == "cuda") {
    if (device_count() == 0) throw std::runtime_error("--backend cuda: no CUDA device found (use --backend cpu)");
    throw std::runtime_error("--backend cuda: the CUDA backend is not implemented yet; use --backend cpu");
  }
  throw std::invalid_argument("unknown backend '" + options.kind + "' (use cpu, cuda or auto)");
}

}  // namespace kvfleet
