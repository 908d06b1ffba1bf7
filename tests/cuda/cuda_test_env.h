// Shared by the CUDA tests: whether to run, skip or fail for want of a GPU, and small helpers.
//
// No GPU (no device, no driver): every test says SKIP and returns, so CI without a GPU stays green.
// A runtime that is present but fails to initialise is a failure, never a skip; and on the GPU machine
// bench/device/run_cuda_checks.sh sets KVFLEET_REQUIRE_GPU=1, which turns a skip into a failure too.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/device_info.h"
#include "kvfleet/backend.h"

namespace kvfleet::test {

inline bool gpu_available() {
  const CudaProbe p = cuda_probe();
  if (p.devices > 0) return true;
  if (!p.no_device) FAIL("the CUDA runtime failed to initialise (not a missing GPU): " << p.error);
  if (std::getenv("KVFLEET_REQUIRE_GPU")) FAIL("KVFLEET_REQUIRE_GPU is set but no CUDA device was found: " << p.error);
  MESSAGE("SKIP: no CUDA device (" << p.error << "); set KVFLEET_REQUIRE_GPU=1 to make this a failure");
  return false;
}

#define KVF_REQUIRE_GPU_OR_SKIP() \
  if (!::kvfleet::test::gpu_available()) return

inline std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||a - b|| / ||b||, NaN-safe: a NaN anywhere gives infinity.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Host bytes of a weight in a dtype (rounded like a checkpoint would be) and a TensorView over them.
struct HostWeight {
  std::vector<std::uint8_t> bytes;
  TensorView view;
  HostWeight(const std::vector<float>& values, DType dt, std::vector<std::int64_t> shape) {
    bytes.resize(values.size() * dtype_size(dt));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (dt == DType::f32) std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      const std::uint16_t h = dt == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      if (dt != DType::f32) std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    view.data = bytes.data();
    view.dtype = dt;
    view.shape = std::move(shape);
    view.name = "test";
  }
};

// A device buffer of one backend, filled from and read back to host vectors.
template <typename T>
class DeviceVec {
 public:
  DeviceVec(Backend& b, const std::vector<T>& host) : b_(b), n_(host.size()) {
    p_ = static_cast<T*>(b.allocate(n_ * sizeof(T)));
    b.to_device(p_, host.data(), n_ * sizeof(T));
  }
  DeviceVec(Backend& b, std::size_t n) : DeviceVec(b, std::vector<T>(n, T(-12345))) {}  // poisoned
  ~DeviceVec() { b_.deallocate(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> out(n_);
    b_.to_host(out.data(), p_, n_ * sizeof(T));
    return out;
  }

 private:
  Backend& b_;
  std::size_t n_;
  T* p_ = nullptr;
};

}  // namespace kvfleet::test
