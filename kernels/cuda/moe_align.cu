// Groups the (row, rank) pairs of a step by expert (CPU reference: the counting sort in
// kernels/cpu/moe_experts.cpp). One block: thread t owns experts t, t + blockDim, ... and scans the pairs
// in order twice, once to count and once to hand out slots, so slots within an expert follow the rows
// (a stable, deterministic grouping; no atomics).
#include "kernels/cuda/check.h"
#include "kernels/cuda/moe.h"

namespace kvfleet::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void moe_align_kernel(const std::int32_t* ids, std::int64_t pairs, std::int64_t top_k, int experts,
                                 std::int32_t* offsets, std::int32_t* position, std::int32_t* source,
                                 std::int32_t* counts) {
  __shared__ std::int32_t start[kMaxExperts + 1];
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    std::int32_t n = 0;
    for (std::int64_t i = 0; i < pairs; ++i) n += ids[i] == e ? 1 : 0;
    start[e + 1] = n;
    if (counts) counts[e] += n;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int e = 0; e < experts; ++e) start[e + 1] += start[e];
    for (int e = 0; e <= experts; ++e) offsets[e] = start[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    std::int32_t slot = start[e];
    for (std::int64_t i = 0; i < pairs; ++i)
      if (ids[i] == e) {
        position[i] = slot;
        source[slot++] = static_cast<std::int32_t>(i / top_k);
      }
  }
}

}  // namespace

void moe_align(const std::int32_t* ids, std::int64_t pairs, std::int64_t top_k, std::int64_t num_experts,
               std::int32_t* offsets, std::int32_t* position, std::int32_t* source, std::int32_t* counts,
               cudaStream_t stream) {
  if (num_experts > kMaxExperts) throw std::runtime_error("moe_align: too many experts");
  moe_align_kernel<<<1, kThreads, 0, stream>>>(ids, pairs, top_k, static_cast<int>(num_experts), offsets, position,
                                               source, counts);
  check_launch("moe_align_kernel");
}

}  // namespace kvfleet::cuda
