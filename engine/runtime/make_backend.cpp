#include <stdexcept>

#include "kvfleet/backend.h"

namespace kvfleet {

#ifdef KVFLEET_HAVE_CUDA
int cuda_device_count();  // kernels/cuda/device_info.cu
#endif

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.kind == "cpu") return make_cpu_backend(options.threads);
  if (options.kind == "cuda" || options.kind == "auto") {
    int devices = 0;
#ifdef KVFLEET_HAVE_CUDA
    devices = cuda_device_count();
#endif
    if (options.kind == "auto") return make_cpu_backend(options.threads);
    if (devices == 0) throw std::runtime_error("--backend cuda: no CUDA device found (use --backend cpu)");
    // The CUDA backend (issue 5) is not built yet: say so rather than run something else.
    throw std::runtime_error("--backend cuda: the CUDA backend is not implemented yet; use --backend cpu");
  }
  throw std::invalid_argument("unknown backend '" + options.kind + "' (use cpu, cuda or auto)");
}

}  // namespace kvfleet
