// Row gather for expert parallelism's dispatch (CPU reference: CpuBackend::gather_rows, a copy per row):
// the rows a rank sends, in dispatch order, so that NCCL sends one contiguous piece per peer.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/moe.h"

namespace kvfleet::cuda {
namespace {

__global__ void gather_rows_kernel(const float* x, const std::int32_t* rows, std::int64_t n, std::int64_t dim,
                                   float* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n * dim;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = x[static_cast<std::int64_t>(rows[i / dim]) * dim + i % dim];
}

}  // namespace

void gather_rows(const float* x, const std::int32_t* rows, std::int64_t n, std::int64_t dim, float* out,
                 cudaStream_t stream) {
  if (n == 0 || dim == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n * dim + 255) / 256, 65535));
  gather_rows_kernel<<<blocks, 256, 0, stream>>>(x, rows, n, dim, out);
  check_launch("gather_rows_kernel");
}

}  // namespace kvfleet::cuda
