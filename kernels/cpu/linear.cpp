// cpu::linear: arranges x once per call, splits the output features across the pool in a fixed way, and
// runs the kernel of the instruction set chosen once per process (cpu_isa.h). What each output element
// computes is fixed by linear_kernels.h, so neither the split nor the kernel changes a single bit.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

using detail::kBlock;
using detail::kLanes;

// x rows in the block order of linear_kernels.h, zero-padded to kp.
void arrange(const float* x, std::int64_t rows, std::int64_t in, std::int64_t kp, DType dt, float* xa) {
  for (std::int64_t t = 0; t < rows; ++t) {
    const float* src = x + t * in;
    float* dst = xa + t * kp;
    std::fill(dst + in, dst + kp, 0.0f);
    if (dt != DType::bf16) {
      std::copy(src, src + in, dst);
      continue;
    }
    for (std::int64_t b = 0; b < kp; b += kBlock) {
      for (std::int64_t j = 0; j < kLanes; ++j) {
        const std::int64_t e = b + 2 * j, o = e + 1;
        dst[b + j] = e < in ? src[e] : 0.0f;
        dst[b + kLanes + j] = o < in ? src[o] : 0.0f;
      }
    }
  }
}

using Kernel = void (*)(const detail::GemmArgs&, std::int64_t, std::int64_t);

Kernel kernel_for(Isa isa) {
  switch (isa) {
    case Isa::avx512: return detail::gemm_avx512;
    case Isa::avx2: return detail::gemm_avx2;
    case Isa::scalar: break;
  }
  return detail::gemm_scalar;
}

// Output features are handed out in units of kUnit (the tiles' widths divide it), so that a thread's range
// starts on a tile boundary; a unit never straddles two parts.
constexpr std::int64_t kUnit = 8;

std::int64_t units_of(std::int64_t out) { return (out + kUnit - 1) / kUnit; }

}  // namespace

void linear_multi(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, const LinearPart* parts,
                  std::int64_t num_parts) {
  if (rows <= 0 || num_parts <= 0) return;
  const std::int64_t kp = detail::arranged_len(in);
  // Arranged x depends on the weight dtype: parts of different dtypes run one by one.
  const DType dt = parts[0].w.dtype;
  for (std::int64_t p = 1; p < num_parts; ++p)
    if (parts[p].w.dtype != dt) {
      for (std::int64_t q = 0; q < num_parts; ++q) linear_multi(pool, x, rows, in, parts + q, 1);
      return;
    }
  thread_local std::vector<float> xa;
  xa.resize(static_cast<std::size_t>(rows * kp));
  arrange(x, rows, in, kp, dt, xa.data());
  const float* arranged = xa.data();  // not xa inside the lambda: a thread_local names each thread's own
  std::vector<std::int64_t> first_unit(static_cast<std::size_t>(num_parts) + 1, 0);
  for (std::int64_t p = 0; p < num_parts; ++p)
    first_unit[static_cast<std::size_t>(p) + 1] = first_unit[static_cast<std::size_t>(p)] + units_of(parts[p].out);
  const Kernel kernel = kernel_for(cpu_isa());
  // Fewer than ~2 units per thread (or a tiny product) is not worth a hand-off.
  const std::int64_t grain = std::max<std::int64_t>(2, 4096 / std::max<std::int64_t>(1, rows * in / kUnit));
  pool.parallel_for(first_unit.back(), grain, [&](std::int64_t u0, std::int64_t u1) {
    for (std::int64_t p = 0; p < num_parts; ++p) {
      const LinearPart& part = parts[p];
      const std::int64_t b = std::max(u0, first_unit[static_cast<std::size_t>(p)]);
      const std::int64_t e = std::min(u1, first_unit[static_cast<std::size_t>(p) + 1]);
      if (b >= e) continue;
      const std::int64_t n0 = (b - first_unit[static_cast<std::size_t>(p)]) * kUnit;
      const std::int64_t n1 = std::min(part.out, (e - first_unit[static_cast<std::size_t>(p)]) * kUnit);
      const detail::GemmArgs g{arranged, rows, in, kp, static_cast<const std::uint8_t*>(part.w.data),
                               static_cast<std::size_t>(in) * dtype_size(part.w.dtype), part.w.dtype, part.y, part.out};
      kernel(g, n0, n1);
      if (part.bias.data)
        for (std::int64_t t = 0; t < rows; ++t)
          for (std::int64_t n = n0; n < n1; ++n)
            part.y[t * part.out + n] += load_as_f32(part.bias.data, part.bias.dtype, static_cast<std::size_t>(n));
    }
  });
}

void linear(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, WeightRef w, std::int64_t out,
            WeightRef bias, float* y) {
  const LinearPart part{w, out, bias, y};
  linear_multi(pool, x, rows, in, &part, 1);
}

float dot(const float* x, WeightRef w, std::int64_t n) {
  const std::int64_t kp = detail::arranged_len(n);
  std::vector<float> xa(static_cast<std::size_t>(kp));
  arrange(x, 1, n, kp, w.dtype, xa.data());
  float out = 0.0f;
  const detail::GemmArgs g{xa.data(), 1, n, kp, static_cast<const std::uint8_t*>(w.data),
                           static_cast<std::size_t>(n) * dtype_size(w.dtype), w.dtype, &out, 1};
  kernel_for(cpu_isa())(g, 0, 1);
  return out;
}

}  // namespace kvfleet::cpu
