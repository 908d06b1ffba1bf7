// The engine's equivalence guarantee on MoE models: outputs are bit-identical however requests are
// batched, chunked, cached or preempted, because the MoE kernels are batch-invariant (kernels/cpu/moe.h).
// Also: the runner's per-expert token counts add up, and reach EngineStats.
#include <doctest/doctest.h>

#include <numeric>

#include "runtime/engine_harness.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

constexpr std::int32_t kVocab = 300;

Model make_moe(const test::TempDir& dir, const std::string& arch, bool packed) {
  MakeModelOptions o;
  o.arch = arch;
  o.dtype = DType::bf16;
  o.vocab = kVocab;
  o.layers = 2;
  o.experts = 8;
  o.experts_per_tok = 2;
  o.packed_experts = packed;
  if (arch == "qwen2_moe") o.mlp_only_layers = {0};  // one dense layer, one sparse with the shared expert
  make_model(o, dir.path());
  return Model::load(dir.path());
}

void check_equivalence(const Model& model) {
  const auto requests = test::equivalence_requests(kVocab);
  const auto alone = test::run_requests(model, requests, test::engine_config(64, 256, false), true, nullptr);
  REQUIRE(alone.size() == requests.size());
  struct Case {
    const char* name;
    EngineConfig c;
  };
  const Case cases[] = {
      {"batched, prefix cache", test::engine_config(128, 256, true)},
      {"batched, no prefix cache", test::engine_config(128, 256, false)},
      {"chunked prefill, budget 8", test::engine_config(128, 8, true)},
      {"chunked prefill, budget 61", test::engine_config(128, 61, true)},
      {"small cache: preemption", test::engine_config(14, 64, true)},
  };
  for (const auto& k : cases) {
    EngineStats stats;
    const auto got = test::run_requests(model, requests, k.c, false, &stats);
    test::check_equals_alone(k.name, alone, got, stats);
  }
}

}  // namespace

TEST_CASE("MoE (qwen2_moe, shared expert, a dense layer): batched, cached, chunked, preempted == alone") {
  test::TempDir dir;
  check_equivalence(make_moe(dir, "qwen2_moe", false));
}

TEST_CASE("MoE (qwen3_moe, packed experts, q/k norm): batched, cached, chunked, preempted == alone") {
  test::TempDir dir;
  check_equivalence(make_moe(dir, "qwen3_moe", true));
}

TEST_CASE("the runner counts each step's tokens per expert: top_k per token in every sparse layer") {
  test::TempDir dir;
  const Model model = make_moe(dir, "qwen2_moe", false);
  const std::vector<TokenId> ids{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  auto backend = make_cpu_backend(2);
  RunnerOptions ro;
  ro.num_blocks = 4;
  ModelRunner runner(model, *backend, ro);
  std::vector<std::int32_t> table{0, 1, 2, 3};
  ForwardBatch batch;
  batch.chunks.push_back({ids, 0, table, SeqChunk::Logits::last});
  runner.forward(batch);
  const auto& counts = runner.expert_tokens();
  REQUIRE(counts.size() == 2 * 8);
  CHECK(std::accumulate(counts.begin(), counts.begin() + 8, 0) == 0);                     // layer 0 is dense
  CHECK(std::accumulate(counts.begin() + 8, counts.end(), 0) == 2 * static_cast<int>(ids.size()));  // top-2
  CHECK(*std::max_element(counts.begin() + 8, counts.end()) <= static_cast<int>(ids.size()));
}
