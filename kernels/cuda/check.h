// Error checks for CUDA and cuBLAS calls: every failure throws, naming the call that failed.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace kvfleet::cuda {

inline void check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  // Clear a non-sticky error (an allocation that failed) so the next launch check does not report it again.
  (void)cudaGetLastError();
  throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                             ")");
}

// After a kernel launch: a bad configuration shows up here, a fault in the kernel at the next sync.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace kvfleet::cuda

#define KVF_CUDA(call) ::kvfleet::cuda::check((call), #call)
