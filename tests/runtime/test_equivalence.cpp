// The engine's outputs are bit-identical however requests are batched, chunked, cached or preempted.
#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>

#include "runtime/engine_harness.h"
#include "kvfleet/make_model.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

constexpr std::int32_t kVocab = 300;

struct Fixture {
  test::TempDir dir;
  Model model;
  std::vector<GenerationRequest> requests;

  Fixture() : model(make()), requests(test::equivalence_requests(kVocab)) {}

  Model make() {
    MakeModelOptions o;
    o.dtype = DType::bf16;
    o.vocab = kVocab;
    o.layers = 2;
    make_model(o, dir.path());
    return Model::load(dir.path());
  }
};

EngineConfig config(std::int32_t num_blocks, std::int32_t budget, bool prefix_cache) {
  EngineConfig c;
  c.num_blocks = num_blocks;
  c.scheduler.max_num_batched_tokens = budget;
  c.scheduler.max_num_seqs = 16;
  c.enable_prefix_caching = prefix_cache;
  c.backend.kind = "cpu";
  c.backend.threads = 2;
  return c;
}

// Every request submitted at once; returns outputs by request index.
std::map<std::size_t, test::Collected> run_batched(const Fixture& f, const EngineConfig& c, EngineStats* stats) {
  Engine engine(f.model, c);
  test::Collector col;
  for (std::size_t i = 0; i < f.requests.size(); ++i) engine.submit(f.requests[i], col.callback(i));
  engine.wait_idle();
  if (stats) *stats = engine.stats();
  const auto kv = engine.stats().scheduler.kv;
  CHECK_MESSAGE(kv.num_free_blocks == kv.num_blocks, "blocks leaked");
  return col.results();
}

}  // namespace

TEST_CASE("batched, cached, chunked and preempted runs equal each request run alone") {
  Fixture f;
  // Alone: one request at a time, no prefix cache.
  std::map<std::size_t, test::Collected> alone;
  {
    Engine engine(f.model, config(64, 256, false));
    test::Collector col;
    for (std::size_t i = 0; i < f.requests.size(); ++i) {
      engine.submit(f.requests[i], col.callback(i));
      engine.wait_idle();
    }
    alone = col.results();
  }
  REQUIRE(alone.size() == f.requests.size());
  for (const auto& [i, c] : alone) {
    CHECK(c.finals == 1);
    CHECK(c.reason == FinishReason::length);
    CHECK(c.tokens.size() == static_cast<std::size_t>(f.requests[i].max_tokens));
  }
  struct Case {
    const char* name;
    EngineConfig c;
  };
  const Case cases[] = {
      {"batched, prefix cache", config(128, 256, true)},
      {"batched, no prefix cache", config(128, 256, false)},
      {"chunked prefill, budget 8", config(128, 8, true)},
      {"chunked prefill, budget 16", config(128, 16, true)},
      {"chunked prefill, budget 61", config(128, 61, true)},
      {"small cache: preemption", config(14, 64, true)},
  };
  for (const auto& k : cases) {
    EngineStats stats;
    const auto got = run_batched(f, k.c, &stats);
    test::check_equals_alone(k.name, alone, got, stats);
  }
}

TEST_CASE("a second request sharing a 512-token prefix computes only its new tokens") {
  Fixture f;
  Engine engine(f.model, config(128, 1024, true));
  std::vector<TokenId> prefix(512);
  for (std::size_t i = 0; i < prefix.size(); ++i) prefix[i] = static_cast<TokenId>((i * 7 + 1) % kVocab);
  GenerationRequest a, b;
  a.prompt = prefix;
  a.prompt.insert(a.prompt.end(), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  b.prompt = prefix;
  b.prompt.insert(b.prompt.end(), {11, 12, 13, 14, 15, 16, 17});
  a.max_tokens = b.max_tokens = 1;
  test::Collector col;
  engine.submit(a, col.callback(0));
  engine.wait_idle();
  const auto before = engine.stats().prompt_tokens;
  CHECK(before == 522);
  engine.submit(b, col.callback(1));
  engine.wait_idle();
  CHECK(col.results()[1].cached_tokens == 512);
  CHECK(engine.stats().prompt_tokens - before == 7);
  CHECK(engine.stats().scheduler.kv.prefix_hit_tokens == 512);
}

TEST_CASE("aborts in every state end the request once and free its blocks") {
  Fixture f;
  Engine engine(f.model, config(32, 16, true));
  test::Collector col;
  std::vector<RequestId> ids;
  for (std::size_t i = 0; i < f.requests.size(); ++i) {
    auto r = f.requests[i];
    // The ones aborted below ask for 400 tokens (prompt + 400 < the cache's 512): with 50, a main thread
    // held off its core for ~50 of this tiny model's steps (a few ms, under a parallel ctest) saw request 0
    // finish by length before its abort (1 run in ~460 under load).
    r.max_tokens = i % 2 == 0 ? 400 : 50;
    ids.push_back(engine.submit(r, col.callback(i)));
  }
  for (std::size_t i = 0; i < ids.size(); i += 2) engine.abort(ids[i]);  // waiting, prefilling or decoding
  engine.abort(987654);                                                 // unknown: ignored
  engine.wait_idle();
  const auto results = col.results();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(i);
    CHECK(results.at(i).finals == 1);
    if (i % 2 == 0) CHECK(results.at(i).reason == FinishReason::aborted);
    else CHECK(results.at(i).reason == FinishReason::length);
  }
  const auto kv = engine.stats().scheduler.kv;
  CHECK(kv.num_free_blocks == kv.num_blocks);
}

TEST_CASE("stop conditions: eos, stop token ids, max_tokens, context length, bad requests") {
  Fixture f;
  EngineConfig c = config(64, 256, true);
  c.max_model_len = 50;
  Engine engine(f.model, c);
  // Find what greedy produces, then stop on its third token.
  GenerationRequest r;
  r.prompt = {5, 6, 7};
  r.max_tokens = 6;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  test::Collector col;
  engine.submit(r, col.callback(0));
  engine.wait_idle();
  const auto free_run = col.results()[0].tokens;
  REQUIRE(free_run.size() == 6);
  r.stop_token_ids = {free_run[2]};
  engine.submit(r, col.callback(1));
  r.stop_token_ids.clear();
  r.max_tokens = 200;  // the context (50) ends it first
  engine.submit(r, col.callback(2));
  engine.wait_idle();
  auto res = col.results();
  const auto expected_stop = std::find(free_run.begin(), free_run.end(), free_run[2]) - free_run.begin() + 1;
  CHECK(res[1].tokens.size() == static_cast<std::size_t>(expected_stop));
  CHECK(res[1].reason == FinishReason::stop);
  CHECK(res[2].tokens.size() == 47);
  CHECK(res[2].reason == FinishReason::length);

  GenerationRequest bad;
  CHECK_THROWS_WITH_AS(engine.submit(bad, nullptr), "prompt must not be empty", std::invalid_argument);
  bad.prompt = {kVocab};
  CHECK_THROWS_AS(engine.submit(bad, nullptr), std::invalid_argument);
  bad.prompt = std::vector<TokenId>(50, 1);
  CHECK_THROWS_AS(engine.submit(bad, nullptr), std::invalid_argument);
  bad.prompt = {1};
  bad.sampling.top_p = 2.0f;
  CHECK_THROWS_AS(engine.submit(bad, nullptr), std::invalid_argument);
}

TEST_CASE("a sequence stops with reason length when it would outgrow the whole KV cache") {
  Fixture f;
  Engine engine(f.model, config(4, 64, true));  // 64 tokens of cache
  GenerationRequest r;
  r.prompt = std::vector<TokenId>(20, 3);
  r.max_tokens = 500;
  r.ignore_eos = true;
  test::Collector col;
  engine.submit(r, col.callback(0));
  engine.wait_idle();
  CHECK(col.results()[0].tokens.size() == 44);
  CHECK(col.results()[0].reason == FinishReason::length);
}
