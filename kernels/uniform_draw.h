// The seeded uniform draw in [0, 1) that sampling uses, one definition for the host (engine/sample/sampler.cpp)
// and the device (kernels/cuda/sampling.cu), so that a seed picks the same token on the CPU and the GPU.
// splitmix64 of (splitmix64(seed) ^ index), top 53 bits.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVFLEET_HOST_DEVICE __host__ __device__
#else
#define KVFLEET_HOST_DEVICE
#endif

namespace kvfleet::kernels {

KVFLEET_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

KVFLEET_HOST_DEVICE inline double uniform_draw(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t bits = splitmix64(splitmix64(seed) ^ index);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace kvfleet::kernels
