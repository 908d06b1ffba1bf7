// cpu::linear: arranges x once per call, splits the output features across the pool in a fixed way, and
// runs the kernel of the instruction set chosen once per process (cpu_isa.h). What each output element
// computes is fixed by linear_kernels.h, so neither the split, the weight layout nor the kernel changes a
// single bit (except the opt-in avx512bf16 mode, which is consistent with itself).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"

namespace kvfleet::cpu {
namespace {

using detail::kBlock;
using detail::kLanes;
using detail::kPanel;

// x rows in the block order of linear_kernels.h, zero-padded to kp (bf16: whole blocks with AVX2 shuffles, the
// build's baseline; they ran ~2% of a prefill on the caller alone as a scalar loop).
void arrange(const float* x, std::int64_t rows, std::int64_t in, std::int64_t kp, DType dt, float* xa) {
  for (std::int64_t t = 0; t < rows; ++t) {
    const float* src = x + t * in;
    float* dst = xa + t * kp;
    std::fill(dst + in, dst + kp, 0.0f);
    if (dt != DType::bf16) {
      std::copy(src, src + in, dst);
      continue;
    }
    std::int64_t b = 0;
    for (; b + kBlock <= in; b += kBlock)  // whole blocks: 16 elements' evens and odds by two shuffles each
      for (std::int64_t h = 0; h < 2; ++h) {
        const __m256 a = _mm256_loadu_ps(src + b + 16 * h), c = _mm256_loadu_ps(src + b + 16 * h + 8);
        const __m256 even = _mm256_shuffle_ps(a, c, 0x88), odd = _mm256_shuffle_ps(a, c, 0xdd);  // 64-bit pairs 0 2 1 3
        _mm256_storeu_ps(dst + b + 8 * h, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xd8)));
        _mm256_storeu_ps(dst + b + kLanes + 8 * h, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xd8)));
      }
    for (; b < kp; b += kBlock) {
      for (std::int64_t j = 0; j < kLanes; ++j) {
        const std::int64_t e = b + 2 * j, o = e + 1;
        dst[b + j] = e < in ? src[e] : 0.0f;
        dst[b + kLanes + j] = o < in ? src[o] : 0.0f;
      }
    }
  }
}

using Kernel = void (*)(const detail::GemmArgs&, std::int64_t, std::int64_t);

// How a kernel wants x: arranged rows (arrange), in the AVX-512 kernel's row tiles (arrange_tiled), or
// as arrange_bf16's bf16 (the avx512bf16 mode on bf16 weights).
enum class XLayout { rows, tiles, bf16 };

struct Path {
  Kernel kernel;
  XLayout x;
};

Path path_for(Isa isa, DType dt) {
  switch (isa) {
    case Isa::avx512bf16:
      if (dt == DType::bf16) return {detail::gemm_avx512bf16, XLayout::bf16};
      return {detail::gemm_avx512, XLayout::tiles};
    case Isa::avx512: return {detail::gemm_avx512, XLayout::tiles};
    case Isa::avx2: return {detail::gemm_avx2, XLayout::rows};
    case Isa::scalar: break;
  }
  return {detail::gemm_scalar, XLayout::rows};
}

// x arranged for `path` into a thread_local buffer (valid until this thread's next call), starting on a
// cache line: rows are kp floats (a multiple of 128 bytes), so every 64-byte load of x in the kernels is
// then one line, not a split across two (measured: 1.05-1.25x on the AVX-512 GEMM, bench_matvec).
const float* arranged_x(const Path& path, const float* x, std::int64_t rows, std::int64_t in, std::int64_t kp, DType dt) {
  constexpr std::size_t kLine = 64 / sizeof(float);
  thread_local std::vector<float> buf;
  buf.resize(static_cast<std::size_t>(rows * kp) + kLine);
  const auto misaligned = reinterpret_cast<std::uintptr_t>(buf.data()) / sizeof(float) % kLine;
  float* xa = buf.data() + (misaligned ? kLine - misaligned : 0);
  switch (path.x) {
    case XLayout::bf16: detail::arrange_bf16(x, rows, in, kp, xa); break;
    case XLayout::tiles: detail::arrange_tiled(x, rows, in, kp, dt, xa); break;
    case XLayout::rows: arrange(x, rows, in, kp, dt, xa); break;
  }
  return xa;
}

std::int64_t units_of(std::int64_t out) { return (out + kPanel - 1) / kPanel; }

// Calls of up to kTaperRows rows (memory-bound: each weight is read once per call) split the features into
// tapered chunks (ThreadPool::parallel_for_tapered) whose last ones hold ~96 KiB (g_tail_bytes) of weights:
// short enough that the threads end within a few microseconds of each other, long enough that the start of a
// chunk's stream (docs/cpu_backend.md) is small beside it.
constexpr std::int64_t kTaperRows = 8;
std::atomic<std::int64_t> g_tail_bytes{96 << 10};  // set_taper_tail_bytes: benchmarks compare in one process

// KVFLEET_CPU_TAPER=0 (read once; or set_tapered_split): equal chunks for every call, no taper, for A/B
// runs. Same bits either way.
std::atomic<bool>& tapered_split() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("KVFLEET_CPU_TAPER");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return on;
}

}  // namespace

namespace detail {

void set_tapered_split(bool on) { tapered_split().store(on, std::memory_order_relaxed); }

void set_taper_tail_bytes(std::int64_t bytes) { g_tail_bytes.store(bytes, std::memory_order_relaxed); }
std::int64_t taper_tail_bytes() { return g_tail_bytes.load(std::memory_order_relaxed); }

}  // namespace detail

std::size_t packed_weight_bytes(std::int64_t out, std::int64_t in, DType dtype) {
  return static_cast<std::size_t>(units_of(out) * kPanel * detail::arranged_len(in)) * dtype_size(dtype);
}

void pack_weight(const void* w, DType dtype, std::int64_t out, std::int64_t in, void* dst, ThreadPool* pool) {
  const std::size_t elem = dtype_size(dtype), block = static_cast<std::size_t>(kBlock) * elem;
  const auto* src = static_cast<const std::uint8_t*>(w);
  const std::int64_t kp = detail::arranged_len(in);
  auto panels = [&](std::int64_t p0, std::int64_t p1) {
    auto* d = static_cast<std::uint8_t*>(dst) + static_cast<std::size_t>(p0 * kPanel * kp) * elem;
    for (std::int64_t p = p0; p < p1; ++p)
      for (std::int64_t b = 0; b < kp; b += kBlock)
        for (std::int64_t f = 0; f < kPanel; ++f, d += block) {
          const std::int64_t n = p * kPanel + f, valid = n < out ? std::min(kBlock, in - b) : 0;
          if (valid > 0) std::memcpy(d, src + static_cast<std::size_t>(n * in + b) * elem, static_cast<std::size_t>(valid) * elem);
          std::memset(d + static_cast<std::size_t>(valid) * elem, 0, block - static_cast<std::size_t>(valid) * elem);
        }
  };
  if (pool) pool->parallel_for(units_of(out), 16, panels);
  else panels(0, units_of(out));
}

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
  // The parts' bookkeeping lives on the stack (no allocation per call: ~50 calls a decode token); more
  // parts than that (no caller has them) go kMaxParts at a time.
  constexpr std::int64_t kMaxParts = 4;
  if (num_parts > kMaxParts) {
    for (std::int64_t q = 0; q < num_parts; q += kMaxParts)
      linear_multi(pool, x, rows, in, parts + q, std::min(kMaxParts, num_parts - q));
    return;
  }
  const Path path = path_for(cpu_isa(), dt);
  const float* arranged = arranged_x(path, x, rows, in, kp, dt);  // read by every thread
  std::array<std::int64_t, kMaxParts + 1> first_unit{};
  std::array<detail::GemmArgs, kMaxParts> args{};
  for (std::int64_t p = 0; p < num_parts; ++p) {
    const auto i = static_cast<std::size_t>(p);
    first_unit[i + 1] = first_unit[i] + units_of(parts[p].out);
    detail::GemmArgs& g = args[i];
    g.xa = arranged;
    g.rows = rows;
    g.in = in;
    g.kp = kp;
    const WeightRef& w = parts[p].w;
    const bool use_packed = w.packed != nullptr;  // then the plain weight is never read (ops.h)
    g.w = static_cast<const std::uint8_t*>(use_packed ? w.packed : w.data);
    g.y = parts[p].y;
    g.ldy = parts[p].out;
    detail::set_layout(g, dt, use_packed);
  }
  // Fewer than ~2 panels per thread (or a tiny product) is not worth a hand-off.
  const std::int64_t grain = std::max<std::int64_t>(2, 4096 / std::max<std::int64_t>(1, rows * in / kPanel));
  auto body = [&](std::int64_t u0, std::int64_t u1) {
    for (std::int64_t p = 0; p < num_parts; ++p) {
      const LinearPart& part = parts[p];
      const auto i = static_cast<std::size_t>(p);
      const std::int64_t b = std::max(u0, first_unit[i]), e = std::min(u1, first_unit[i + 1]);
      if (b >= e) continue;
      const std::int64_t n0 = (b - first_unit[i]) * kPanel, n1 = std::min(part.out, (e - first_unit[i]) * kPanel);
      path.kernel(args[i], n0, n1);
      if (part.bias.data)
        for (std::int64_t t = 0; t < rows; ++t)
          for (std::int64_t n = n0; n < n1; ++n)
            part.y[t * part.out + n] += load_as_f32(part.bias.data, part.bias.dtype, static_cast<std::size_t>(n));
    }
  };
  const std::int64_t units = first_unit[static_cast<std::size_t>(num_parts)];
  if (rows > kTaperRows || !tapered_split().load(std::memory_order_relaxed)) {
    pool.parallel_for(units, grain, body);
    return;
  }
  // Few rows stream the weights at the memory's speed: chunks that shrink to ~g_tail_bytes of weights, so the
  // threads end an op within a few microseconds of each other (equal quarters of a thread's share left one
  // idle for up to a quarter of it).
  const std::int64_t unit_bytes = kPanel * kp * static_cast<std::int64_t>(dtype_size(dt));
  const std::int64_t tail_bytes = g_tail_bytes.load(std::memory_order_relaxed);
  pool.parallel_for_tapered(units, grain, std::max<std::int64_t>(1, tail_bytes / unit_bytes), body);
}

void linear(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, WeightRef w, std::int64_t out,
            WeightRef bias, float* y) {
  const LinearPart part{w, out, bias, y};
  linear_multi(pool, x, rows, in, &part, 1);
}

float dot(const float* x, WeightRef w, std::int64_t n) {
  const std::int64_t kp = detail::arranged_len(n);
  const Path path = path_for(cpu_isa(), w.dtype);
  std::vector<float> xa(static_cast<std::size_t>(kp));
  if (path.x == XLayout::bf16) detail::arrange_bf16(x, 1, n, kp, xa.data());
  else arrange(x, 1, n, kp, w.dtype, xa.data());  // one row: the same in every layout
  float out = 0.0f;
  detail::GemmArgs g;
  g.xa = xa.data();
  g.rows = 1;
  g.in = n;
  g.kp = kp;
  g.w = static_cast<const std::uint8_t*>(w.data);
  g.y = &out;
  g.ldy = 1;
  detail::set_layout(g, w.dtype, false);
  path.kernel(g, 0, 1);
  return out;
}

}  // namespace kvfleet::cpu
