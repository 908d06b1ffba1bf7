// tests/engine/test_equivalence.cpp's guarantee on the CUDA backend: a request's output is bit-identical
// whether it runs alone, batched, with the prefix cache, with chunked prefill or through preemption.
// Needs the batch-invariant GEMM (BackendOptions::batch_invariant, on by default).
#include <algorithm>
#include <functional>

#include "../engine/engine_harness.h"
#include "cuda_test_env.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

constexpr std::int32_t kVocab = 300;

EngineConfig config(std::int32_t num_blocks, std::int32_t budget, bool prefix_cache) {
  EngineConfig c;
  c.num_blocks = num_blocks;
  c.scheduler.max_num_batched_tokens = budget;
  c.scheduler.max_num_seqs = 16;
  c.enable_prefix_caching = prefix_cache;
  c.backend.kind = "cuda";
  return c;
}

std::map<std::size_t, test::Collected> run(const Model& model, const std::vector<GenerationRequest>& requests,
                                           const EngineConfig& c, bool one_at_a_time, EngineStats* stats) {
  Engine engine(model, c);
  test::Collector col;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    engine.submit(requests[i], col.callback(i));
    if (one_at_a_time) engine.wait_idle();
  }
  engine.wait_idle();
  if (stats) *stats = engine.stats();
  const auto kv = engine.stats().scheduler.kv;
  CHECK_MESSAGE(kv.num_free_blocks == kv.num_blocks, "blocks leaked");
  return col.results();
}

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
  const auto alone = run(model, requests, config(64, 256, false), true, nullptr);
  REQUIRE(alone.size() == requests.size());
  for (const auto& [i, c] : alone) CHECK(c.tokens.size() == static_cast<std::size_t>(requests[i].max_tokens));
  struct Case {
    const char* name;
    EngineConfig c;
  };
  const Case cases[] = {
      {"batched, prefix cache", config(128, 256, true)},   {"batched, no prefix cache", config(128, 256, false)},
      {"chunked prefill, budget 8", config(128, 8, true)}, {"chunked prefill, budget 61", config(128, 61, true)},
      {"small cache: preemption", config(14, 64, true)},
  };
  for (const auto& k : cases) {
    EngineStats stats;
    const auto got = run(model, requests, k.c, false, &stats);
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
  EngineConfig cpu = config(128, 256, true);
  cpu.backend.kind = "cpu";
  cpu.backend.threads = 2;
  const auto want = run(model, requests, cpu, false, nullptr);
  const auto got = run(model, requests, config(128, 256, true), false, nullptr);
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
