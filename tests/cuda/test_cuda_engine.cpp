// tests/runtime/test_equivalence.cpp's guarantee on the CUDA backend: a request's output is bit-identical
// whether it runs alone, batched, with the prefix cache, with chunked prefill or through preemption.
// Needs the batch-invariant GEMM (BackendOptions::batch_invariant, on by default).
#include <algorithm>
#include <functional>

#include "runtime/engine_harness.h"
#include "cuda_test_env.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

constexpr std::int32_t kVocab = 300;

}  // namespace

TEST_CASE("cuda engine: batched, cached, chunked and preempted runs equal each request run alone") {
  KVF_REQUIRE_GPU_OR_SKIP();
  test::TempDir dir;
  MakeModelOptions o;
  o.dtype = DType::bf16;
  o.vocab = kVocab;
  o.layers = 2;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  const auto requests = test::equivalence_requests(kVocab);
  const auto alone = test::run_requests(model, requests, test::engine_config(64, 256, false, "cuda"), true, nullptr);
  REQUIRE(alone.size() == requests.size());
  for (const auto& [i, c] : alone) CHECK(c.tokens.size() == static_cast<std::size_t>(requests[i].max_tokens));
  struct Case {
    const char* name;
    EngineConfig c;
  };
  const Case cases[] = {
      {"batched, prefix cache", test::engine_config(128, 256, true, "cuda")},   {"batched, no prefix cache", test::engine_config(128, 256, false, "cuda")},
      {"chunked prefill, budget 8", test::engine_config(128, 8, true, "cuda")}, {"chunked prefill, budget 61", test::engine_config(128, 61, true, "cuda")},
      {"small cache: preemption", test::engine_config(14, 64, true, "cuda")},
  };
  for (const auto& k : cases) {
    EngineStats stats;
    const auto got = test::run_requests(model, requests, k.c, false, &stats);
    test::check_equals_alone(k.name, alone, got, stats);
  }
}

TEST_CASE("cuda engine: greedy output on an fp32 model equals the CPU engine's") {
  KVF_REQUIRE_GPU_OR_SKIP();
  test::TempDir dir;
  MakeModelOptions o;
  o.vocab = kVocab;
  o.layers = 2;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  auto requests = test::equivalence_requests(kVocab);
  for (auto& r : requests) r.sampling.temperature = 0.0f;
  EngineConfig cpu = test::engine_config(128, 256, true, "cuda");
  cpu.backend.kind = "cpu";
  cpu.backend.threads = 2;
  const auto want = test::run_requests(model, requests, cpu, false, nullptr);
  const auto got = test::run_requests(model, requests, test::engine_config(128, 256, true, "cuda"), false, nullptr);
  // fp32 logits agree to ~1e-6 relative, so greedy choices may only differ where the CPU's top two
  // logits are closer than 1e-4 of the largest |logit| (a near-tie); anything else is a bug. Ties counted.
  auto cpu_backend = make_cpu_backend(2);
  int near_ties = 0;
  for (const auto& [i, c] : want) {
    CAPTURE(i);
    const auto& g = got.at(i).tokens;
    REQUIRE(g.size() == c.tokens.size());
    const auto diverge = std::mismatch(g.begin(), g.end(), c.tokens.begin()).first - g.begin();
    if (diverge == static_cast<std::ptrdiff_t>(g.size())) continue;
    std::vector<TokenId> context = requests[i].prompt;
    context.insert(context.end(), c.tokens.begin(), c.tokens.begin() + diverge);
    const auto logits = all_position_logits(model, *cpu_backend, context);
    std::vector<float> last(logits.end() - kVocab, logits.end());
    const auto [lo, hi] = std::minmax_element(last.begin(), last.end());
    const float scale = std::max(std::abs(*lo), std::abs(*hi));
    std::partial_sort(last.begin(), last.begin() + 2, last.end(), std::greater<>());
    CHECK_MESSAGE(last[0] - last[1] < 1e-4f * scale, "greedy diverges at token " << diverge << " without a near-tie");
    ++near_ties;
  }
  MESSAGE("greedy CUDA vs CPU: " << near_ties << " of " << want.size() << " requests diverge at a near-tie");
}
