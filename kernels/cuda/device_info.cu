// The first CUDA translation unit: compiled in CI from day one (nvcc is installed even where no GPU is).
#include <cuda_runtime.h>

namespace kvfleet {

// Number of usable CUDA devices; 0 when there is no driver or no device.
int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

}  // namespace kvfleet
