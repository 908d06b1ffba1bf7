// Every CUDA kernel against its CPU reference, op by op through the two backends (ggml's test-backend-ops
// idea), on random inputs. Tolerances are ||cuda - cpu|| / ||cpu|| and are stated per check.
#include <algorithm>
#include <numeric>

#include "cuda_test_env.h"
#include "kernels/cpu/ops_extra.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"

using namespace kvfleet;
using test::DeviceVec;
using test::HostWeight;

namespace {

struct Pair {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  std::unique_ptr<Backend> gpu;
  explicit Pair(bool batch_invariant = true) {
    BackendOptions o;
    o.batch_invariant = batch_invariant;
    gpu = make_cuda_backend(o);
  }
};

const DType kWeightTypes[] = {DType::f32, DType::bf16, DType::f16};

}  // namespace

TEST_CASE("cuda: make_backend picks or refuses the GPU") {
  const CudaProbe p = cuda_probe();
  BackendOptions o;
  o.kind = "cuda";
  if (p.devices == 0) {
    CHECK_THROWS_WITH_AS(make_backend(o), doctest::Contains("no CUDA device found: "), std::runtime_error);
    o.kind = "auto";
    CHECK(make_backend(o)->name() == "cpu");
    CHECK(chosen_backend_kind(o) == "cpu");
    return;
  }
  CHECK(make_backend(o)->name() == "cuda");
  o.kind = "auto";
  CHECK(make_backend(o)->name() == "cuda");
  CHECK(chosen_backend_kind(o) == "cuda");  // what the replica's KV events name as the tier (gpu)
  o.kind = "cuda";
  o.device = p.devices;  // one past the last
  CHECK_THROWS_WITH_AS(make_backend(o), doctest::Contains("does not exist"), std::runtime_error);
}

TEST_CASE("cuda: a failing CUDA call throws, naming the call") {
  KVF_REQUIRE_GPU_OR_SKIP();
  Pair p;
  CHECK_THROWS_WITH_AS(p.gpu->allocate(std::size_t{1} << 52), doctest::Contains("cudaMalloc"), std::runtime_error);
  DeviceVec<float> still_usable(*p.gpu, std::vector<float>{1.5f, 2.5f});  // not a sticky error
  CHECK(still_usable.host() == std::vector<float>{1.5f, 2.5f});
  // The next launch's check must not report the old allocation failure.
  DeviceVec<float> up(*p.gpu, std::vector<float>{2.0f, 2.0f});
  CHECK_NOTHROW(p.gpu->silu_mul(still_usable.get(), up.get(), 2));
  const auto got = still_usable.host();
  CHECK(got[0] == doctest::Approx(2.0f * 1.5f / (1.0f + std::exp(-1.5f))));
}

TEST_CASE("cuda: embedding gather equals the CPU exactly") {
  KVF_REQUIRE_GPU_OR_SKIP();
  Pair p;
  std::mt19937 rng(1);
  const std::int64_t vocab = 97, dim = 72, n = 13;
  for (DType dt : kWeightTypes) {
    CAPTURE(dtype_name(dt));
    HostWeight table(test::random_floats(vocab * dim, rng), dt, {vocab, dim});
    std::vector<std::int32_t> ids(n);
    for (auto& i : ids) i = static_cast<std::int32_t>(rng() % vocab);
    std::vector<float> want(n * dim);
    p.cpu->embedding(p.cpu->upload_weight(table.view), dim, ids.data(), n, want.data());
    DeviceVec<std::int32_t> d_ids(*p.gpu, ids);
    DeviceVec<float> out(*p.gpu, n * dim);
    p.gpu->embedding(p.gpu->upload_weight(table.view), dim, d_ids.get(), n, out.get());
    CHECK(out.host() == want);
  }
}

TEST_CASE("cuda: rms_norm and add_rms_norm match the CPU (rel 1e-6)") {
  KVF_REQUIRE_GPU_OR_SKIP();
  Pair p;
  std::mt19937 rng(2);
  for (std::int64_t dim : {64, 333, 2048}) {
    for (DType dt : kWeightTypes) {
      CAPTURE(dim);
      CAPTURE(dtype_name(dt));
      const std::int64_t rows = 7;
      HostWeight w(test::random_floats(dim, rng, 0.3f), dt, {dim});
      auto x = test::random_floats(rows * dim, rng, 2.0f), delta = test::random_floats(rows * dim, rng);
      std::vector<float> want(rows * dim), residual = x;
      p.cpu->rms_norm(x.data(), rows, dim, p.cpu->upload_weight(w.view), 1e-5f, want.data());
      DeviceVec<float> d_x(*p.gpu, x), d_delta(*p.gpu, delta), out(*p.gpu, rows * dim);
      const DeviceWeight gw = p.gpu->upload_weight(w.view);
      p.gpu->rms_norm(d_x.get(), rows, dim, gw, 1e-5f, out.get());
      CHECK(test::rel_error(out.host(), want) < 1e-6);
      p.cpu->add_rms_norm(residual.data(), delta.data(), rows, dim, p.cpu->upload_weight(w.view), 1e-5f, want.data());
      p.gpu->add_rms_norm(d_x.get(), d_delta.get(), rows, dim, gw, 1e-5f, out.get());
      CHECK(d_x.host() == residual);  // the same fp32 additions
      CHECK(test::rel_error(out.host(), want) < 1e-6);
    }
  }
}

TEST_CASE("cuda: silu_mul matches the CPU (rel 1e-6)") {
  KVF_REQUIRE_GPU_OR_SKIP();
  Pair p;
  std::mt19937 rng(3);
  auto gate = test::random_floats(10007, rng, 3.0f), up = test::random_floats(10007, rng);
  DeviceVec<float> d_gate(*p.gpu, gate), d_up(*p.gpu, up);
  p.cpu->silu_mul(gate.data(), up.data(), 10007);
  p.gpu->silu_mul(d_gate.get(), d_up.get(), 10007);
  CHECK(test::rel_error(d_gate.host(), gate) < 1e-6);
}

TEST_CASE("cuda: linear matches the CPU and is batch-invariant") {
  KVF_REQUIRE_GPU_OR_SKIP();
  Pair inv(true), fast(false);
  std::mt19937 rng(4);
  for (std::int64_t in : {200, 256, 2048}) {  // 200: the unaligned (scalar) path
    for (DType dt : kWeightTypes) {
      CAPTURE(in);
      CAPTURE(dtype_name(dt));
      const std::int64_t out = 301, rows = 37;
      HostWeight w(test::random_floats(out * in, rng, 1.0f / std::sqrt(float(in))), dt, {out, in});
      HostWeight b(test::random_floats(out, rng, 0.3f), dt, {out});
      const auto x = test::random_floats(rows * in, rng);
      std::vector<float> want(rows * out);
      inv.cpu->linear(x.data(), rows, in, inv.cpu->upload_weight(w.view), out, inv.cpu->upload_weight(b.view),
                      want.data());
      for (Pair* p : {&inv, &fast}) {
        const bool invariant = p == &inv;
        CAPTURE(invariant);
        DeviceVec<float> d_x(*p->gpu, x), y(*p->gpu, rows * out);
        const DeviceWeight gw = p->gpu->upload_weight(w.view), gb = p->gpu->upload_weight(b.view);
        p->gpu->linear(d_x.get(), rows, in, gw, out, gb, y.get());
        const auto got = y.host();
        // fp32 sums in another order: 1e-5. cuBLAS rounds x to bf16 (2^-9) or f16 (2^-12) first.
        const double tol = invariant || dt == DType::f32 ? 1e-5 : dt == DType::bf16 ? 1e-2 : 2e-3;
        CHECK(test::rel_error(got, want) < tol);
        if (!invariant) continue;
        // Each row alone (rows = 1, another tile) gives the very same bits as in the batch of 37.
        for (std::int64_t r : {0, 8, 36}) {
          DeviceVec<float> y1(*p->gpu, out);
          p->gpu->linear(d_x.get() + r * in, 1, in, gw, out, gb, y1.get());
          const auto alone = y1.host();
          CHECK(std::equal(alone.begin(), alone.end(), got.begin() + r * out));
        }
      }
    }
  }
}

TEST_CASE("cuda: dtype conversions round like the CPU, bit for bit") {
  KVF_REQUIRE_GPU_OR_SKIP();
  Pair p;
  std::mt19937 rng(5);
  auto x = test::random_floats(4099, rng, 100.0f);
  x[0] = 1.00390625f;  // exactly halfway between two bf16 values: ties to even
  DeviceVec<float> d_x(*p.gpu, x), back(*p.gpu, x.size());
  DeviceVec<std::uint16_t> half(*p.gpu, x.size());
  p.gpu->synchronize();  // the launches below run on the default stream
  for (DType dt : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dt));
    cuda::f32_to_half(d_x.get(), static_cast<std::int64_t>(x.size()), dt, half.get(), nullptr);
    cuda::to_f32(half.get(), dt, static_cast<std::int64_t>(x.size()), back.get(), nullptr);
    KVF_CUDA(cudaDeviceSynchronize());
    const auto got = half.host();
    const auto widened = back.host();
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::uint16_t want = dt == DType::bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
      REQUIRE(got[i] == want);
      REQUIRE(widened[i] == (dt == DType::bf16 ? bf16_to_f32(want) : f16_to_f32(want)));
    }
  }
}

TEST_CASE("cuda: greedy argmax equals the CPU, ties to the lowest id") {
  KVF_REQUIRE_GPU_OR_SKIP();
  Pair p;
  std::mt19937 rng(6);
  const std::int64_t rows = 9, vocab = 128256;
  auto logits = test::random_floats(rows * vocab, rng, 3.0f);
  logits[1 * vocab + 5000] = logits[1 * vocab + 90000] = 50.0f;  // a tie: 5000 wins
  logits[2 * vocab + vocab - 1] = 60.0f;                         // the last id
  std::vector<std::int32_t> want(rows);
  cpu::argmax_rows(logits.data(), rows, vocab, want.data());
  CHECK(want[1] == 5000);
  DeviceVec<float> d_logits(*p.gpu, logits);
  DeviceVec<std::int32_t> out(*p.gpu, static_cast<std::size_t>(rows));
  p.gpu->synchronize();
  cuda::argmax_rows(d_logits.get(), rows, vocab, out.get(), nullptr);
  KVF_CUDA(cudaDeviceSynchronize());
  CHECK(out.host() == want);
}
