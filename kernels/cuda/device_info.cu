// Device discovery: compiled in CI from day one (nvcc is installed even where no GPU is).
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/device_info.h"

namespace kvfleet {

CudaProbe cuda_probe() {
  CudaProbe p;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    p.error = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    // No driver at all reads as "insufficient driver" too; only then (driver version 0) is it a missing
    // GPU. An installed driver too old for this runtime is an initialisation error.
    int driver = 0;
    const bool no_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
    (void)cudaGetLastError();
    p.no_device = e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && no_driver);
    if (e == cudaErrorInsufficientDriver && !no_driver) p.error += " (driver " + std::to_string(driver) + ")";
    return p;
  }
  p.devices = n;
  p.no_device = n == 0;
  if (n == 0) p.error = "cudaGetDeviceCount returned 0 devices";
  return p;
}

int cuda_device_count() { return cuda_probe().devices; }

}  // namespace kvfleet
