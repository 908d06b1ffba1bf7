// The replica's MoE metrics: tokens per expert and load imbalance, from a real engine on an MoE model.
#include <doctest/doctest.h>

#include <regex>

#include "engine/server/replica_metrics.h"
#include "kvfleet/make_model.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

double value(const std::string& text, const std::string& series) {
  const std::regex line("(^|\\n)" + std::regex_replace(series, std::regex(R"([{}"])"), R"(\$&)") + " ([0-9.eE+-]+)");
  std::smatch m;
  return std::regex_search(text, m, line) ? std::stod(m[2]) : -1.0;
}

}  // namespace

TEST_CASE("MoE load metrics: tokens per expert add up to top_k per token per sparse layer") {
  test::TempDir dir;
  MakeModelOptions o;
  o.arch = "mixtral";
  o.layers = 2;
  o.experts = 4;
  o.experts_per_tok = 2;
  o.vocab = 128;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  EngineConfig c;
  c.num_blocks = 32;
  c.backend.kind = "cpu";
  c.backend.threads = 1;
  Engine engine(model, c);
  GenerationRequest r;
  r.prompt = {1, 2, 3, 4, 5, 6, 7};
  r.max_tokens = 4;
  r.ignore_eos = true;
  engine.submit(r, nullptr);
  engine.wait_idle();
  const EngineStats s = engine.stats();
  // 7 prompt tokens + 3 decode steps (the 4th token is sampled from the 3rd decode's logits).
  const double tokens = 7 + 3;
  server::ReplicaMetrics metrics(16);
  const std::string text = metrics.render(s);
  double sum = 0.0;
  for (int e = 0; e < 4; ++e) {
    const double v = value(text, "kvfleet_moe_expert_tokens_total{expert=\"" + std::to_string(e) + "\"}");
    CHECK(v >= 0.0);
    sum += v;
  }
  CHECK(sum == tokens * 2 * 2);  // top-2, two sparse layers
  CHECK(value(text, "kvfleet_moe_steps_total") == 4);  // one prefill step + three decode steps
  const double last = value(text, "kvfleet_moe_load_imbalance_ratio");
  CHECK(last >= 1.0);
  CHECK(last <= 4.0);
  CHECK(value(text, "kvfleet_moe_load_imbalance_ratio_sum_total") >= 4.0);
  // A second scrape with no new steps adds nothing.
  const std::string again = metrics.render(engine.stats());
  CHECK(value(again, "kvfleet_moe_steps_total") == 4);
}

TEST_CASE("a dense model exposes no MoE metrics") {
  server::ReplicaMetrics metrics(16);
  CHECK(metrics.render(EngineStats{}).find("kvfleet_moe_") == std::string::npos);
}
