// Embedding gather, widening the table's dtype to fp32 (CPU reference: kernels/cpu/embedding.cpp).
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace kvfleet::cuda {
namespace {

template <typename T>
__global__ void embedding_kernel(const T* table, std::int64_t dim, const std::int32_t* ids, float* out) {
  const std::int64_t row = blockIdx.x;
  const T* src = table + static_cast<std::int64_t>(ids[row]) * dim;
  for (std::int64_t d = threadIdx.x; d < dim; d += blockDim.x) out[row * dim + d] = to_float(src[d]);
}

}  // namespace

void embedding(WeightRef table, std::int64_t dim, const std::int32_t* ids, std::int64_t n, float* out,
               cudaStream_t stream) {
  if (n == 0) return;
  KVF_DISPATCH_DTYPE(table.dtype, T,
                     embedding_kernel<T>
                     <<<static_cast<unsigned>(n), 256, 0, stream>>>(static_cast<const T*>(table.data), dim, ids, out));
  check_launch("embedding_kernel");
}

}  // namespace kvfleet::cuda
