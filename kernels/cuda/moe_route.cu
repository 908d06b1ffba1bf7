// Router softmax + top-k, one warp per row (CPU reference: kernels/cpu/moe_route.cpp). Lane l holds the
// probabilities of experts l, l + 32, ...; the top-k is k rounds of a warp argmax (ties: lower id).
// expf, not __expf: the CPU's function. The softmax sum is a fixed butterfly, so a row's weights do not
// depend on the batch (they may differ from the CPU's sequential sum in the last bits).
#include <cfloat>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"

namespace kvfleet::cuda {
namespace {

constexpr int kPerLane = static_cast<int>(kMaxExperts / 32);
constexpr int kWarpsPerBlock = 4;

__global__ void moe_route_kernel(const float* logits, std::int64_t rows, int experts, int top_k, bool renormalize,
                                 std::int32_t* ids, float* weights) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* l = logits + r * experts;
  float p[kPerLane];
  float max = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? l[e] : -FLT_MAX;
    max = fmaxf(max, p[i]);
  }
  max = warp_max(max);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? expf(p[i] - max) : -1.0f;  // -1: not an expert, never chosen
    if (e < experts) sum += p[i];
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (lane + 32 * i < experts) p[i] /= sum;
  float kept = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    float best = -2.0f;
    int best_id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (p[i] > best) best = p[i], best_id = lane + 32 * i;  // ascending ids: the first max is the lowest
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, o);
      const int id = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (v > best || (v == best && id < best_id)) best = v, best_id = id;
    }
    if (best_id % 32 == lane) p[best_id / 32] = -2.0f;  // taken
    if (lane == 0) {
      ids[r * top_k + j] = best_id;
      weights[r * top_k + j] = best;
    }
    kept += best;
  }
  if (renormalize && lane == 0)
    for (int j = 0; j < top_k; ++j) weights[r * top_k + j] /= kept;
}

}  // namespace

void moe_route(const float* logits, std::int64_t rows, std::int64_t num_experts, std::int64_t top_k, bool renormalize,
               std::int32_t* ids, float* weights, cudaStream_t stream) {
  if (rows == 0) return;
  if (num_experts > kMaxExperts || top_k > num_experts)
    throw std::runtime_error("moe_route: " + std::to_string(num_experts) + " experts, top-" + std::to_string(top_k) +
                             " (at most " + std::to_string(kMaxExperts) + " experts)");
  const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  moe_route_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(logits, rows, static_cast<int>(num_experts),
                                                               static_cast<int>(top_k), renormalize, ids, weights);
  check_launch("moe_route_kernel");
}

}  // namespace kvfleet::cuda
