// Runs requests through an Engine and collects their outputs, for the engine tests.
#pragma once

#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/model.h"

namespace kvfleet::test {

struct Collected {
  std::vector<TokenId> tokens;
  FinishReason reason = FinishReason::none;
  std::int32_t cached_tokens = 0;
  int finals = 0;  // how many outputs said finished (must be exactly 1)
};

class Collector {
 public:
  OutputCallback callback(std::size_t index) {
    return [this, index](const RequestOutput& o) {
      std::lock_guard lock(mu_);
      Collected& c = results_[index];
      c.tokens.insert(c.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) {
        c.reason = o.finish_reason;
        c.cached_tokens = o.num_cached_tokens;
        ++c.finals;
      }
    };
  }
  std::map<std::size_t, Collected> results() {
    std::lock_guard lock(mu_);
    return results_;
  }

 private:
  std::mutex mu_;
  std::map<std::size_t, Collected> results_;
};

// The equivalence tests' verdict for one engine configuration `name`: every request's tokens equal its
// run alone, one final output each, and the cases named for preemption and prefix caching show them.
inline void check_equals_alone(const std::string& name, const std::map<std::size_t, Collected>& alone,
                               const std::map<std::size_t, Collected>& got, const EngineStats& stats) {
  CAPTURE(name);
  for (const auto& [i, c] : alone) {
    const std::size_t request = i;  // CAPTURE's lambda cannot capture a structured binding (clang 14)
    CAPTURE(request);
    CHECK(got.at(i).tokens == c.tokens);
    CHECK(got.at(i).finals == 1);
  }
  if (name == "small cache: preemption") CHECK(stats.scheduler.num_preemptions > 0);
  if (name == "batched, prefix cache") CHECK(stats.scheduler.kv.prefix_hit_tokens > 0);
}

// The equivalence tests' workload (CPU and CUDA): 24 requests, two thirds behind a shared 40-token
// "system prompt", 1-60 more prompt tokens, 1-12 output tokens, greedy and seeded sampling alternating.
inline std::vector<GenerationRequest> equivalence_requests(std::int32_t vocab) {
  std::mt19937 rng(1234);
  std::vector<TokenId> system(40);
  for (auto& t : system) t = static_cast<TokenId>(rng() % vocab);
  std::vector<GenerationRequest> out;
  for (int i = 0; i < 24; ++i) {
    GenerationRequest r;
    if (i % 3 != 2) r.prompt = system;
    const int extra = 1 + static_cast<int>(rng() % 60);
    for (int k = 0; k < extra; ++k) r.prompt.push_back(static_cast<TokenId>(rng() % vocab));
    r.max_tokens = 1 + static_cast<std::int32_t>(rng() % 12);
    r.ignore_eos = true;
    if (i % 2) {  // seeded sampling
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = 50;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = static_cast<std::uint64_t>(i);
      if (i % 4 == 3) {  // temperature alone: the sampler's bucketed path
        r.sampling.top_k = 0;
        r.sampling.top_p = 1.0f;
      }
    } else {
      r.sampling.temperature = 0.0f;
    }
    out.push_back(r);
  }
  return out;
}

// The engine configuration of the equivalence tests: a cache of `num_blocks`, a step budget, 16 sequences.
inline EngineConfig engine_config(std::int32_t num_blocks, std::int32_t budget, bool prefix_cache,
                                  const std::string& backend = "cpu") {
  EngineConfig c;
  c.num_blocks = num_blocks;
  c.scheduler.max_num_batched_tokens = budget;
  c.scheduler.max_num_seqs = 16;
  c.enable_prefix_caching = prefix_cache;
  c.backend.kind = backend;
  if (backend == "cpu") c.backend.threads = 2;
  return c;
}

// Runs `requests` through a new engine (all at once, or each after the previous finished) and returns the
// outputs by request index; checks that no block is left allocated.
inline std::map<std::size_t, Collected> run_requests(const Model& model, const std::vector<GenerationRequest>& requests,
                                                     const EngineConfig& c, bool one_at_a_time, EngineStats* stats) {
  Engine engine(model, c);
  Collector col;
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

}  // namespace kvfleet::test
