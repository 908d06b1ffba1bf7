#include <stdexcept>

#include "kvfleet/backend.h"

#ifdef KVFLEET_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

namespace kvfleet {

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.kind == "cpu") return make_cpu_backend(options.threads);
#ifdef KVFLEET_HAVE_CUDA
  if (options.kind == "cuda") return make_cuda_backend(options);  // throws "no CUDA device found: ..."
  if (options.kind == "auto")
    return cuda_device_count() > 0 ? make_cuda_backend(options) : make_cpu_backend(options.threads);
#else
  if (options.kind == "cuda")
    throw std::runtime_error(
        "--backend cuda: no CUDA device found: this build has no CUDA backend "
        "(configure with -DKVFLEET_CUDA=ON)");
  if (options.kind == "auto") return make_cpu_backend(options.threads);
#endif
  throw std::invalid_argument("unknown backend '" + options.kind + "' (use cpu, cuda or auto)");
}

}  // namespace kvfleet
