// Sampling on the GPU with the semantics of kvfleet::sample() (engine/sample/sampler.cpp, the CPU
// reference): candidates sorted by logit (descending, ties by id: CUB's radix sort is stable), greedy at
// temperature 0, else softmax of logits / temperature in double over the top-k, then the top-p prefix, the
// min-p cut and an inverse-CDF draw with the same counter-based uniform number (splitmix64 of seed, index).
// Sums are block reductions, not the CPU's left-to-right loop, so a draw that lands within rounding of a
// boundary may pick a neighbour: "the same token where possible" (tests/cuda counts the exceptions).
#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda/functional>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/uniform_draw.h"

namespace kvfleet::cuda {
namespace {

constexpr int kThreads = 256;

struct Buffers {
  float* keys;            // [rows][vocab] sorted logits
  std::int32_t* ids_in;   // [rows][vocab] 0..vocab-1
  std::int32_t* ids;      // [rows][vocab] sorted ids
  double* probs;          // [rows][vocab] unnormalised probabilities of the sorted candidates
  std::int32_t* offsets;  // [rows + 1]
  void* cub_temp;
  std::size_t cub_bytes;
};

std::size_t align(std::size_t n) { return (n + 255) / 256 * 256; }

std::size_t cub_bytes(std::int64_t rows, std::int64_t vocab) {
  std::size_t bytes = 0;
  KVF_CUDA(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), static_cast<int>(rows * vocab),
      static_cast<int>(rows), static_cast<const std::int32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr)));
  return bytes;
}

Buffers carve(void* ws, std::int64_t rows, std::int64_t vocab) {
  auto* p = static_cast<char*>(ws);
  const auto n = static_cast<std::size_t>(rows * vocab);
  Buffers b{};
  b.keys = reinterpret_cast<float*>(p);
  p += align(n * 4);
  b.ids_in = reinterpret_cast<std::int32_t*>(p);
  p += align(n * 4);
  b.ids = reinterpret_cast<std::int32_t*>(p);
  p += align(n * 4);
  b.probs = reinterpret_cast<double*>(p);
  p += align(n * 8);
  b.offsets = reinterpret_cast<std::int32_t*>(p);
  p += align(static_cast<std::size_t>(rows + 1) * 4);
  b.cub_temp = p;
  b.cub_bytes = cub_bytes(rows, vocab);
  return b;
}

__global__ void iota_kernel(std::int32_t* ids, std::int64_t rows, std::int64_t vocab, std::int32_t* offsets) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows * vocab;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    ids[i] = static_cast<std::int32_t>(i % vocab);
    if (i % vocab == 0) offsets[i / vocab] = static_cast<std::int32_t>(i);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) offsets[rows] = static_cast<std::int32_t>(rows * vocab);
}


using Scan = cub::BlockScan<double, kThreads>;
using Reduce = cub::BlockReduce<double, kThreads>;
using ReduceInt = cub::BlockReduce<std::int32_t, kThreads>;

// The first i < n whose inclusive prefix sum of p satisfies cum(i) > target (strict) or >= target, or n
// when none does. Chunks of kThreads items, the running prefix carried across chunks.
template <bool kStrict>
__device__ std::int64_t first_crossing(const double* p, std::int64_t n, double target) {
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ typename ReduceInt::TempStorage min_tmp;
  __shared__ double carry;
  __shared__ std::int32_t found;
  if (threadIdx.x == 0) carry = 0.0;
  __syncthreads();
  for (std::int64_t base = 0; base < n; base += kThreads) {
    const std::int64_t i = base + threadIdx.x;
    const double v = i < n ? p[i] : 0.0;
    double incl;
    Scan(scan_tmp).InclusiveSum(v, incl);
    const double cum = carry + incl;
    const bool hit = i < n && (kStrict ? target < cum : cum >= target);
    const std::int32_t first =
        ReduceInt(min_tmp).Reduce(hit ? static_cast<std::int32_t>(threadIdx.x) : kThreads, ::cuda::minimum<>{});
    __syncthreads();
    if (threadIdx.x == kThreads - 1) carry = cum;
    if (threadIdx.x == 0) found = first;
    __syncthreads();
    if (found < kThreads) return base + found;
  }
  return n;
}

__device__ double block_sum(const double* p, std::int64_t n) {
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ double total;
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += kThreads) s += p[i];
  s = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) total = s;
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kThreads)
    pick_kernel(Buffers b, std::int64_t vocab, const SampleRow* rows, std::int32_t* out) {
  const std::int64_t r = blockIdx.x;
  const SampleRow p = rows[r];
  const float* keys = b.keys + r * vocab;
  const std::int32_t* ids = b.ids + r * vocab;
  double* probs = b.probs + r * vocab;
  if (p.temperature == 0.0f) {  // greedy: the first of the sorted candidates
    if (threadIdx.x == 0) out[r] = ids[0];
    return;
  }
  std::int64_t keep = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
  const double max_l = keys[0];
  for (std::int64_t i = threadIdx.x; i < keep; i += kThreads) probs[i] = exp((keys[i] - max_l) / p.temperature);
  __syncthreads();
  const double total = block_sum(probs, keep);
  for (std::int64_t i = threadIdx.x; i < keep; i += kThreads) probs[i] /= total;
  __syncthreads();
  if (p.top_p < 1.0f) {  // the smallest prefix whose mass reaches top_p (all of it if none does)
    const std::int64_t first = first_crossing<false>(probs, keep, p.top_p);
    keep = first < keep ? first + 1 : keep;
  }
  if (p.min_p > 0.0f) {  // sorted, so the kept ones are a prefix: count them
    __shared__ typename ReduceInt::TempStorage count_tmp;
    __shared__ std::int32_t count;
    std::int32_t c = 0;
    for (std::int64_t i = 1 + threadIdx.x; i < keep; i += kThreads) c += probs[i] >= p.min_p * probs[0];
    c = ReduceInt(count_tmp).Sum(c);
    if (threadIdx.x == 0) count = c;
    __syncthreads();
    keep = 1 + count;
  }
  const double mass = block_sum(probs, keep);
  const double target = kernels::uniform_draw(p.seed, p.draw_index) * mass;
  const std::int64_t i = first_crossing<true>(probs, keep, target);
  if (threadIdx.x == 0) out[r] = ids[i < keep ? i : keep - 1];
}

}  // namespace

std::size_t sample_workspace_bytes(std::int64_t rows, std::int64_t vocab) {
  const auto n = static_cast<std::size_t>(rows * vocab);
  return 3 * align(n * 4) + align(n * 8) + align(static_cast<std::size_t>(rows + 1) * 4) + cub_bytes(rows, vocab);
}

void sample_rows(const float* logits, std::int64_t rows, std::int64_t vocab, const SampleRow* d_rows, void* workspace,
                 std::int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  if (rows * vocab > INT32_MAX) throw std::invalid_argument("sample_rows: rows * vocab exceeds 2^31");
  Buffers b = carve(workspace, rows, vocab);
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((rows * vocab + 255) / 256, 65535));
  iota_kernel<<<blocks, 256, 0, stream>>>(b.ids_in, rows, vocab, b.offsets);
  check_launch("iota_kernel");
  KVF_CUDA(cub::DeviceSegmentedRadixSort::SortPairsDescending(b.cub_temp, b.cub_bytes, logits, b.keys, b.ids_in, b.ids,
                                                              static_cast<int>(rows * vocab), static_cast<int>(rows),
                                                              b.offsets, b.offsets + 1, 0, 32, stream));
  pick_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(b, vocab, d_rows, out);
  check_launch("pick_kernel");
}

}  // namespace kvfleet::cuda
