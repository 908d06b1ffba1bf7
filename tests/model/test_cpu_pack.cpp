// The CPU backend's packed weights (the default; KVFLEET_CPU_PACK=0 reads the plain weights): a model's logits
// are the same bits with and without the packed copies, on every ISA path this CPU has, for prompts (the
// GEMM) and for one row (the GEMV: it reads the packed panels too).
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/cpu_isa.h"
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
