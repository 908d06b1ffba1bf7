// Random workloads on a small cache: integrity after every step, outputs identical to running each
// request alone (so preemption, recompute and prefix hits change nothing), no block leaked.
#include <doctest/doctest.h>

#include <map>
#include <random>

#include "sched_test_util.h"

using namespace kvfleet;
using namespace kvfleet::test;

namespace {

struct Request {
  std::vector<TokenId> prompt;
  int max_tokens = 0;
  int arrival_step = 0;
  std::int32_t priority = 0;
};

// Prompts share one of three prefixes (so the cache gets hits) and end in a random tail.
std::vector<Request> make_workload(std::mt19937& rng, int n) {
  std::vector<std::vector<TokenId>> prefixes{iota_tokens(12, 1), iota_tokens(9, 500), {}};
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt = prefixes[rng() % prefixes.size()];
    const int tail = 1 + static_cast<int>(rng() % 24);
    for (int j = 0; j < tail; ++j) r.prompt.push_back(static_cast<TokenId>(rng() % 50));
    r.max_tokens = 1 + static_cast<int>(rng() % 16);
    r.arrival_step = static_cast<int>(rng() % 40);
    r.priority = static_cast<std::int32_t>(rng() % 3);
    out.push_back(std::move(r));
  }
  return out;
}

struct RunResult {
  std::map<std::size_t, std::vector<TokenId>> outputs;  // by request index (aborted ones absent)
  SchedulerStats stats;
};

// The engine loop: arrivals, step, stop checks (max_tokens), random aborts when abort_per_mille > 0.
RunResult run(const std::vector<Request>& reqs, const SchedulerConfig& sc, const KvCacheConfig& kc, std::mt19937& rng,
              unsigned abort_per_mille) {
  Harness h(sc, kc);
  std::map<SeqId, std::size_t> live;
  RunResult result;
  for (int step = 0; step < 2000; ++step) {
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i].arrival_step == step) live[h.add(reqs[i].prompt, reqs[i].priority)] = i;
    }
    if (step > 40 && live.empty()) break;
    h.step();
    for (auto it = live.begin(); it != live.end();) {
      const Sequence* s = h.sched.get(it->first);
      const bool done = s->num_output_tokens() >= reqs[it->second].max_tokens;
      if (done) result.outputs[it->second] = outputs_of(h.sched, it->first);
      if (done || rng() % 1000 < abort_per_mille) {
        REQUIRE(h.sched.finish(it->first, done ? FinishReason::length : FinishReason::aborted));
        REQUIRE(h.sched.check_integrity() == "");
        it = live.erase(it);
      } else {
        ++it;
      }
    }
  }
  REQUIRE(live.empty());
  CHECK(h.sched.kv().pool().num_free() == kc.num_blocks);  // nothing leaked
  result.stats = h.sched.stats();
  return result;
}

}  // namespace

TEST_CASE("random workloads: same outputs as alone, preemptions and prefix hits happen, no leaks") {
  for (unsigned seed : {1u, 2u, 3u, 4u}) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    const auto reqs = make_workload(rng, 30);
    for (bool chunked : {true, false}) {
      CAPTURE(chunked);
      const RunResult r = run(reqs, sched_config(chunked ? 24 : 48, 6, chunked), kv_config(20), rng, 0);
      REQUIRE(r.outputs.size() == reqs.size());
      for (const auto& entry : r.outputs) {  // no structured binding: CAPTURE's lambda (clang 14)
        const auto& [i, out] = entry;
        const auto request = i;
        CAPTURE(request);
        CHECK(out == reference_outputs(reqs[i].prompt, reqs[i].max_tokens));
      }
      CHECK(r.stats.num_preemptions > 0);
      CHECK(r.stats.kv.prefix_hit_tokens > 0);
      CHECK(r.stats.kv.evicted_blocks > 0);
    }
  }
}

TEST_CASE("random workloads with random aborts and priorities keep every invariant") {
  for (unsigned seed : {11u, 12u, 13u}) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    const auto reqs = make_workload(rng, 40);
    const RunResult r = run(reqs, sched_config(16, 5, true, true), kv_config(16), rng, 30);
    CHECK(r.outputs.size() < reqs.size());  // some were aborted
    for (const auto& [i, out] : r.outputs) CHECK(out == reference_outputs(reqs[i].prompt, reqs[i].max_tokens));
  }
}
