// Constrained decoding in the engine: a grammar's mask decides which tokens may be sampled, exactly (the model's
// own greedy choice is kept whenever the grammar allows it), batch-invariantly, and its end finishes the request.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>

#include "kvfleet/make_model.h"
#include "runtime/engine_harness.h"
#include "support/sequence_grammar.h"
#include "support/temp_dir.h"

using namespace kvfleet;
using test::SequenceGrammar;

namespace {

constexpr std::int32_t kVocab = 300;
constexpr TokenId kEos = kVocab - 1;  // make_model's eos_token_id

struct Fixture {
  test::TempDir dir;
  Model model;
  Fixture() : model(make()) {}
  Model make() {
    MakeModelOptions o;
    o.dtype = DType::bf16;
    o.vocab = kVocab;
    o.layers = 2;
    make_model(o, dir.path());
    return Model::load(dir.path());
  }
};

std::vector<TokenId> prompt_of(int i) {
  std::mt19937 rng(static_cast<unsigned>(100 + i));
  std::vector<TokenId> p(5 + static_cast<std::size_t>(i) * 3);
  for (auto& t : p) t = static_cast<TokenId>(rng() % (kVocab - 1));
  return p;
}

GenerationRequest greedy(std::vector<TokenId> prompt, std::int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::shared_ptr<const TokenGrammar> grammar(std::vector<std::vector<TokenId>> seqs, std::vector<TokenId> stops = {kEos}) {
  return std::make_shared<SequenceGrammar>(std::move(seqs), std::move(stops), kVocab);
}

// Whether `out` is an allowed sequence followed by a stop id (finished by stop), or a prefix of one (length).
bool allowed(const std::vector<std::vector<TokenId>>& seqs, const test::Collected& out) {
  for (const auto& s : seqs) {
    if (out.reason == FinishReason::stop) {
      std::vector<TokenId> want = s;
      want.push_back(kEos);
      if (out.tokens == want) return true;
    } else if (out.reason == FinishReason::length && out.tokens.size() <= s.size() + 1 &&
               std::equal(out.tokens.begin(), out.tokens.begin() + static_cast<std::ptrdiff_t>(std::min(out.tokens.size(), s.size())), s.begin())) {
      return true;
    }
  }
  return false;
}

TokenId other_than(TokenId t, int k) { return static_cast<TokenId>((t + k) % (kVocab - 1)); }

}  // namespace

TEST_CASE("greedy constrained output equals unconstrained greedy output wherever the grammar allows it") {
  Fixture f;
  const auto c = test::engine_config(64, 256, true);
  std::vector<GenerationRequest> plain;
  for (int i = 0; i < 6; ++i) plain.push_back(greedy(prompt_of(i), 8));
  const auto free_run = test::run_requests(f.model, plain, c, false, nullptr);
  std::vector<GenerationRequest> constrained, capped;
  for (int i = 0; i < 6; ++i) {
    const auto& u = free_run.at(static_cast<std::size_t>(i)).tokens;
    REQUIRE(u.size() == 8);
    // The model's output among others: a fork after 3 tokens, a different first token, a longer variant.
    std::vector<TokenId> fork(u.begin(), u.begin() + 3), longer = u;
    fork.push_back(other_than(u[3], 1));
    longer.push_back(other_than(u[7], 5));
    const auto g = grammar({fork, {other_than(u[0], 2), 7, 8}, u, longer});
    GenerationRequest r = greedy(prompt_of(i), 12);
    r.grammar = g;
    constrained.push_back(r);
    r.max_tokens = 8;
    capped.push_back(r);
  }
  const auto got = test::run_requests(f.model, constrained, c, false, nullptr);
  const auto got_capped = test::run_requests(f.model, capped, c, false, nullptr);
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    const auto& u = free_run.at(static_cast<std::size_t>(i)).tokens;
    const auto& out = got.at(static_cast<std::size_t>(i));
    // The model's own 8 tokens; then `longer`'s last token only if the model prefers it to the end.
    REQUIRE(out.tokens.size() >= 9);
    CHECK(std::vector<TokenId>(out.tokens.begin(), out.tokens.begin() + 8) == u);
    CHECK(out.reason == FinishReason::stop);
    CHECK(out.tokens.back() == kEos);
    CHECK(out.finals == 1);
    // max_tokens reached before the grammar ends: length, as vLLM.
    CHECK(got_capped.at(static_cast<std::size_t>(i)).tokens == u);
    CHECK(got_capped.at(static_cast<std::size_t>(i)).reason == FinishReason::length);
  }
}

TEST_CASE("a grammar that forbids the model's choice gives an allowed output, the best allowed token each step") {
  Fixture f;
  const auto c = test::engine_config(64, 256, true);
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    const auto free_out = test::run_requests(f.model, {greedy(prompt_of(i), 1)}, c, false, nullptr).at(0).tokens;
    // Two first tokens, neither the model's; forcing each alone gives the model's continuation after it.
    const TokenId a = other_than(free_out[0], 3), b = other_than(free_out[0], 11);
    const std::vector<std::vector<TokenId>> seqs{{a, 10, 11}, {b, 12}};
    GenerationRequest r = greedy(prompt_of(i), 10);
    r.grammar = grammar(seqs);
    const auto out = test::run_requests(f.model, {r}, c, false, nullptr).at(0);
    CHECK(allowed(seqs, out));
    CHECK(out.reason == FinishReason::stop);
    // Greedy among the allowed: the one of a, b with the larger logit, which is what a grammar of {a, b}
    // alone picks too (a one-token grammar, so the rest cannot matter).
    GenerationRequest first = greedy(prompt_of(i), 1);
    first.grammar = grammar({{a}, {b}});
    CHECK(out.tokens.front() == test::run_requests(f.model, {first}, c, false, nullptr).at(0).tokens.front());
  }
}

TEST_CASE("a grammar without stop ids ends the request on its last token, with finish reason stop") {
  Fixture f;
  GenerationRequest r = greedy(prompt_of(2), 20);
  r.grammar = grammar({{5, 6, 7}}, {});
  const auto out = test::run_requests(f.model, {r}, test::engine_config(64, 256, true), false, nullptr).at(0);
  CHECK(out.tokens == std::vector<TokenId>{5, 6, 7});
  CHECK(out.reason == FinishReason::stop);
}

namespace {

// The equivalence workload (greedy and seeded, shared prefixes), every other request constrained by a
// branching grammar of its own; returns the requests and each one's allowed sequences.
std::vector<GenerationRequest> mixed_requests(std::vector<std::vector<std::vector<TokenId>>>& seqs_of) {
  auto requests = test::equivalence_requests(kVocab);
  std::mt19937 rng(77);
  seqs_of.assign(requests.size(), {});
  for (std::size_t i = 0; i < requests.size(); i += 2) {
    auto& seqs = seqs_of[i];
    std::vector<TokenId> trunk(4);
    for (auto& t : trunk) t = static_cast<TokenId>(rng() % (kVocab - 1));
    for (int k = 0; k < 5; ++k) {  // five branches off a shared trunk, 5 to 14 tokens long
      std::vector<TokenId> s(trunk.begin(), trunk.begin() + static_cast<std::ptrdiff_t>(rng() % 4));
      for (std::size_t n = 5 + rng() % 10; s.size() < n;) s.push_back(static_cast<TokenId>(rng() % (kVocab - 1)));
      seqs.push_back(s);
    }
    requests[i].grammar = grammar(seqs);
    requests[i].max_tokens = 16;
  }
  return requests;
}

}  // namespace

TEST_CASE("constrained sequences give the same tokens alone, batched, chunked and preempted") {
  Fixture f;
  std::vector<std::vector<std::vector<TokenId>>> seqs_of;
  const auto requests = mixed_requests(seqs_of);
  const auto alone = test::run_requests(f.model, requests, test::engine_config(64, 256, false), true, nullptr);
  REQUIRE(alone.size() == requests.size());
  for (std::size_t i = 0; i < requests.size(); i += 2) {
    CAPTURE(i);
    CHECK(allowed(seqs_of[i], alone.at(i)));
  }
  struct Case {
    const char* name;
    EngineConfig c;
  };
  const Case cases[] = {
      {"batched, prefix cache", test::engine_config(128, 256, true)},
      {"chunked prefill, budget 8", test::engine_config(128, 8, true)},
      {"chunked prefill, budget 61", test::engine_config(128, 61, true)},
      {"small cache: preemption", test::engine_config(14, 64, true)},
  };
  for (const auto& k : cases) {
    EngineStats stats;
    const auto got = test::run_requests(f.model, requests, k.c, false, &stats);
    test::check_equals_alone(k.name, alone, got, stats);
  }
}

TEST_CASE("seeded constrained sampling reproduces its tokens and never leaves the grammar, on every sampler path") {
  Fixture f;
  const std::vector<std::vector<TokenId>> seqs{{1, 2, 3, 4}, {1, 2, 9}, {1, 40, 41, 42, 43}, {200, 3}, {201}, {202, 5, 6}};
  struct Knobs {
    float temperature;
    std::int32_t top_k;
    float top_p, min_p;
  };
  const Knobs knobs[] = {{1.0f, 0, 1.0f, 0.0f}, {2.0f, 0, 1.0f, 0.0f}, {1.0f, 3, 1.0f, 0.0f}, {1.0f, 50, 0.9f, 0.0f},
                         {1.5f, 0, 0.5f, 0.0f}, {1.0f, 0, 1.0f, 0.2f}, {0.7f, 10, 0.95f, 0.05f}};
  std::vector<GenerationRequest> requests;
  for (int seed = 0; seed < 70; ++seed) {
    const Knobs& k = knobs[seed % 7];
    GenerationRequest r;
    r.prompt = prompt_of(seed % 5);
    r.sampling = {k.temperature, k.top_k, k.top_p, k.min_p, static_cast<std::uint64_t>(seed)};
    r.max_tokens = 10;
    r.grammar = grammar(seqs);
    requests.push_back(r);
  }
  const auto batched = test::run_requests(f.model, requests, test::engine_config(128, 256, true), false, nullptr);
  const auto again = test::run_requests(f.model, requests, test::engine_config(128, 32, true), false, nullptr);
  std::set<std::vector<TokenId>> distinct;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(i);
    CHECK(allowed(seqs, batched.at(i)));
    CHECK(batched.at(i).reason == FinishReason::stop);
    CHECK(batched.at(i).tokens == again.at(i).tokens);
    distinct.insert(batched.at(i).tokens);
  }
  CHECK(distinct.size() > 2);  // the draws do reach different branches
}

TEST_CASE("logprobs of a constrained request are over the allowed tokens") {
  Fixture f;
  Engine engine(f.model, test::engine_config(64, 256, true));
  GenerationRequest r = greedy(prompt_of(1), 5);
  r.logprobs = 5;
  r.grammar = grammar({{20, 21}, {30, 31}});
  std::mutex mu;
  std::vector<RequestOutput::Logprobs> lps;
  engine.submit(r, [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    lps.insert(lps.end(), o.logprobs.begin(), o.logprobs.end());
  });
  engine.wait_idle();
  REQUIRE(lps.size() == 3);
  // Step 0: two allowed tokens, their probabilities summing to 1; a five-token request gets just those two.
  REQUIRE(lps[0].top.size() == 2);
  std::set<TokenId> ids{lps[0].top[0].id, lps[0].top[1].id};
  CHECK(ids == std::set<TokenId>{20, 30});
  CHECK(std::exp(lps[0].top[0].logprob) + std::exp(lps[0].top[1].logprob) == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(lps[0].logprob == lps[0].top[0].logprob);  // greedy took the likelier one
  // Steps 1 and 2: one allowed token each (the branch's next, then the stop id): probability 1.
  CHECK(lps[1].logprob == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(lps[1].top.size() == 1);
  CHECK(lps[2].top.size() == 1);
  CHECK(lps[2].top[0].id == kEos);
}

TEST_CASE("a grammar that fails ends its request alone; a vocabulary larger than the model's is refused") {
  Fixture f;
  std::vector<std::vector<std::vector<TokenId>>> seqs_of;
  auto requests = mixed_requests(seqs_of);
  const auto c = test::engine_config(128, 256, true);
  const auto clean = test::run_requests(f.model, requests, c, false, nullptr);
  auto broken = std::make_shared<SequenceGrammar>(std::vector<std::vector<TokenId>>{{1, 2, 3, 4, 5}},
                                                  std::vector<TokenId>{kEos}, kVocab, 2);
  GenerationRequest bad = greedy(prompt_of(3), 10);
  bad.grammar = broken;
  requests.push_back(bad);
  Engine engine(f.model, c);
  test::Collector col;
  std::string error;
  std::mutex mu;
  for (std::size_t i = 0; i + 1 < requests.size(); ++i) engine.submit(requests[i], col.callback(i));
  engine.submit(bad, [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    if (o.finished) error = o.error;
    col.callback(requests.size() - 1)(o);
  });
  engine.wait_idle();
  const auto got = col.results();
  for (std::size_t i = 0; i + 1 < requests.size(); ++i) CHECK(got.at(i).tokens == clean.at(i).tokens);
  CHECK(got.at(requests.size() - 1).reason == FinishReason::aborted);
  CHECK(got.at(requests.size() - 1).tokens.size() == 2);
  CHECK(error.find("test grammar broke") != std::string::npos);

  GenerationRequest wide = greedy(prompt_of(0), 4);
  wide.grammar = std::make_shared<SequenceGrammar>(std::vector<std::vector<TokenId>>{{1}}, std::vector<TokenId>{},
                                                   kVocab + 1);
  CHECK_THROWS_AS(engine.submit(wide, nullptr), std::invalid_argument);
}
