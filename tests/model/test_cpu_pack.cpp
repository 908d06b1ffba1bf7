// The CPU backend's packed weights (the default; KVFLEET_CPU_PACK=0 reads the plain weights): a model's logits
// are the same bits with and without the packed copies, on every ISA path this CPU has, for prompts (the
// GEMM) and for one row (the GEMV: it reads the packed panels too).
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kvfleet/backend.h"
#include "kvfleet/make_model.h"
#include "runner_helpers.h"
#include "support/temp_dir.h"

using namespace kvfleet;

TEST_CASE("CPU backend: packed weights give the plain weights' logits bit for bit") {
  const char* env = std::getenv("KVFLEET_CPU_PACK");
  const std::string saved = env ? env : "";
  const cpu::Isa saved_isa = cpu::cpu_isa();
  for (DType dt : {DType::bf16, DType::f32}) {
    test::TempDir dir;
    MakeModelOptions o;
    o.dtype = dt;
    o.vocab = 200;
    o.arch = "qwen2";  // attention biases too
    make_model(o, dir.path());
    const Model model = Model::load(dir.path());
    std::vector<TokenId> ids(45), one{17};
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<TokenId>((i * 11 + 3) % 200);
    for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
      if (!cpu::cpu_supports(isa)) continue;
      CAPTURE(cpu::isa_name(isa));
      CAPTURE(dtype_name(dt));
      cpu::set_cpu_isa(isa);
      setenv("KVFLEET_CPU_PACK", "0", 1);
      const auto plain = test::all_logits(model, ids), plain_one = test::all_logits(model, one);
      setenv("KVFLEET_CPU_PACK", "1", 1);
      const auto packed = test::all_logits(model, ids), packed_one = test::all_logits(model, one);
      REQUIRE(plain.size() == packed.size());
      CHECK(std::memcmp(plain.data(), packed.data(), plain.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(plain_one.data(), packed_one.data(), plain_one.size() * sizeof(float)) == 0);
    }
  }
  cpu::set_cpu_isa(saved_isa);
  if (env) setenv("KVFLEET_CPU_PACK", saved.c_str(), 1);
  else unsetenv("KVFLEET_CPU_PACK");
}

// The packed copy is the only one read once made: with the plain weight's pages made unreadable after the
// first call (which packs it), the GEMV and the GEMM still run, and give the first call's bits. A read of
// the plain weight would be a SIGSEGV here.
TEST_CASE("CPU backend: once packed, the plain weight is never read (GEMV and GEMM)") {
  const char* env = std::getenv("KVFLEET_CPU_PACK");
  const std::string saved = env ? env : "";
  setenv("KVFLEET_CPU_PACK", "1", 1);
  const std::int64_t in = 200, out = 70;  // a tail block and a part-filled last panel
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = (static_cast<std::size_t>(in * out) * 2 + page - 1) / page * page;
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* w = static_cast<std::uint16_t*>(map);
  for (std::int64_t i = 0; i < in * out; ++i) w[i] = f32_to_bf16(static_cast<float>((i * 37) % 101 - 50) / 64.0f);
  std::vector<float> x(static_cast<std::size_t>(8 * in));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) / 7.0f - 0.9f;
  {
    auto backend = make_cpu_backend(2);
    const DeviceWeight dw{map, DType::bf16};
    std::vector<float> first(static_cast<std::size_t>(8 * out)), again(first.size());
    backend->linear(x.data(), 8, in, dw, out, {}, first.data());  // packs
    REQUIRE(::mprotect(map, bytes, PROT_NONE) == 0);
    backend->linear(x.data(), 8, in, dw, out, {}, again.data());
    CHECK(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) == 0);
    std::vector<float> one(static_cast<std::size_t>(out));
    backend->linear(x.data(), 1, in, dw, out, {}, one.data());
    CHECK(std::memcmp(first.data(), one.data(), one.size() * sizeof(float)) == 0);  // row 0 alone: same bits
  }
  ::munmap(map, bytes);
  if (env) setenv("KVFLEET_CPU_PACK", saved.c_str(), 1);
  else unsetenv("KVFLEET_CPU_PACK");
}
