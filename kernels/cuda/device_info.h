// Whether this process can use a CUDA device, and why not. Plain C++ (callable from .cpp files).
#pragma once

#include <string>

namespace kvfleet {

struct CudaProbe {
  int devices = 0;
  // True when the machine simply has no GPU or no driver (tests skip); false with devices == 0 means the
  // runtime failed in some other way (tests must fail, not skip).
  bool no_device = true;
  std::string error;  // cudaGetDeviceCount's error, empty on success
};

CudaProbe cuda_probe();
int cuda_device_count();  // 0 when there is no driver or no device

}  // namespace kvfleet
