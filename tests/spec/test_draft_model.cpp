// Draft-model speculation: the rejection rule for drafts drawn from q (the output follows p whatever q is,
// and only with the residual renormalised), the sampler's distribution as a dense vector, and the engine with
// a generated draft model: greedy output equal to speculation off, the draft's cache following the accepted
// tokens, a sampled request's tokens following the target's distribution, bad configurations refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>

#include "engine/spec/draft_model.h"
#include "engine/spec/draft_probs.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"
#include "runtime/engine_harness.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

double chi_square(const std::vector<double>& count, const std::vector<double>& p, double n) {
  double x = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) x += (count[i] - n * p[i]) * (count[i] - n * p[i]) / (n * p[i]);
  return x;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

void make(const test::TempDir& dir, std::int64_t vocab, std::int64_t layers, std::int64_t hidden, std::uint64_t seed) {
  MakeModelOptions o;
  o.arch = "llama";
  o.dtype = DType::bf16;
  o.vocab = vocab;
  o.layers = layers;
  o.hidden = hidden;
  o.intermediate = 2 * hidden;
  o.heads = 4;
  o.kv_heads = 2;
  o.seed = seed;
  make_model(o, dir.path());
}

SpeculativeConfig draft_config(const test::TempDir& dir, std::int32_t k) {
  SpeculativeConfig s;
  s.method = "draft_model";
  s.draft_model = dir.path().string();
  s.num_speculative_tokens = k;
  s.disable_by_batch_size = 64;
  return s;
}

}  // namespace

TEST_CASE("sampling_probs: the distribution sample() draws from, cuts included") {
  const std::vector<float> logits{1.5f, 0.2f, -0.7f, 2.1f, 0.2f, -3.0f, 0.9f, 1.4f};
  SamplingParams a, b, c, d;
  a.temperature = 0.7f;
  a.top_k = 5;
  b.temperature = 1.3f;
  b.top_p = 0.8f;
  c.temperature = 1.0f;
  c.min_p = 0.15f;
  d.temperature = 0.0f;
  for (SamplingParams sp : {a, b, c, d}) {
    CAPTURE(sp.top_k);
    CAPTURE(sp.top_p);
    std::vector<float> probs;
    spec::sampling_probs(logits, sp, probs);
    CHECK(std::abs(std::accumulate(probs.begin(), probs.end(), 0.0) - 1.0) < 1e-5);
    const int n = 20000;
    std::vector<double> count(logits.size(), 0.0);
    for (int s = 0; s < n; ++s) {
      sp.seed = static_cast<std::uint64_t>(s) + 11;
      count[static_cast<std::size_t>(sample(logits, sp, 3))] += 1;
    }
    for (std::size_t i = 0; i < probs.size(); ++i)
      if (probs[i] == 0.0f) CHECK(count[i] == 0);  // a cut token is never drawn
    CHECK(chi_square(count, to_double(probs), n) < 24.3);  // at most 7 degrees of freedom: p = 0.001
  }
  std::vector<float> greedy;
  spec::sampling_probs(logits, d, greedy);
  CHECK(greedy[3] == 1.0f);
}

TEST_CASE("accept_or_resample: drafts drawn from q, tokens distributed as p, acceptance sum min(p, q)") {
  // q differs from p both ways: tokens q favours (rejections, the residual carries the mass back) and tokens
  // q underrates (always accepted).
  const std::vector<float> p{0.30f, 0.05f, 0.25f, 0.10f, 0.20f, 0.10f};
  const std::vector<float> q{0.05f, 0.40f, 0.25f, 0.20f, 0.05f, 0.05f};
  double overlap = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) overlap += std::min(p[i], q[i]);
  const int n = 40000;
  std::vector<double> count(p.size(), 0.0);
  double accepted = 0.0;
  std::vector<float> scratch;
  for (int s = 0; s < n; ++s) {
    const auto seed = static_cast<std::uint64_t>(s) * 31 + 7;
    const TokenId d = spec::draw_from(q, spec::draft_draw(seed, 5));
    const spec::Verdict v =
        spec::accept_or_resample(p, q, d, spec::accept_draw(seed, 5), spec::residual_draw(seed, 5), scratch);
    count[static_cast<std::size_t>(v.token)] += 1;
    accepted += v.accepted ? 1 : 0;
    if (v.accepted) CHECK(v.token == d);
  }
  CHECK(chi_square(count, to_double(p), n) < 20.5);  // 5 degrees of freedom: p = 0.001
  CHECK(std::abs(accepted / n - overlap) < 4 * std::sqrt(0.25 / n));
  // The same draft token, always rejected where q outweighs p by far: the residual never gives it back.
  std::vector<float> scratch2;
  for (int s = 0; s < 100; ++s) {
    const spec::Verdict v = spec::accept_or_resample(p, q, 1, 0.99, spec::residual_draw(9, s), scratch2);
    CHECK(!v.accepted);
    CHECK(v.token != 1);
  }
}

TEST_CASE("draft_model: greedy output equals speculation off; a draft equal to the target is always right") {
  test::TempDir target_dir, draft_dir;
  make(target_dir, 300, 2, 64, 1);
  make(draft_dir, 300, 1, 32, 2);
  const Model model = Model::load(target_dir.path());
  std::vector<GenerationRequest> requests = test::equivalence_requests(300);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.temperature = 0.0f;
    requests[i].max_tokens = 4 + static_cast<std::int32_t>(i % 5) * 6;
  }
  const auto alone = test::run_requests(model, requests, test::engine_config(64, 256, false), true, nullptr);
  auto with = [](EngineConfig c, SpeculativeConfig s) {
    c.speculative = s;
    return c;
  };
  struct Case {
    const char* name;
    EngineConfig c;
  };
  const SpeculativeConfig s = draft_config(draft_dir, 3);
  std::vector<Case> cases{
      {"batched, prefix cache", with(test::engine_config(64, 256, true), s)},
      {"chunked prefill", with(test::engine_config(64, 24, true), s)},
      {"small cache: preemption", with(test::engine_config(14, 256, true), s)},
      {"no prefix cache", with(test::engine_config(64, 64, false), s)},
  };
  for (Case& cs : cases) {
    EngineStats stats;
    const auto got = test::run_requests(model, requests, cs.c, false, &stats);
    test::check_equals_alone(cs.name, alone, got, stats);
    CHECK(stats.spec.method == "draft_model");
    CHECK(stats.spec.num_drafts > 0);
    CHECK(stats.spec.num_draft_tokens > stats.spec.num_accepted_tokens);  // an unrelated draft: some rejected
  }
  // The target as its own draft: every draft is the target's argmax.
  EngineStats stats;
  const auto got = test::run_requests(model, requests, with(test::engine_config(64, 256, true), draft_config(target_dir, 4)),
                                      true, &stats);
  test::check_equals_alone("self-draft", alone, got, stats);
  CHECK(stats.spec.num_draft_tokens > 100);
  CHECK(static_cast<double>(stats.spec.num_accepted_tokens) >= 0.98 * static_cast<double>(stats.spec.num_draft_tokens));
}

TEST_CASE("draft_model proposer: the draft's cache holds the sequence's tokens only, rejected drafts dropped") {
  test::TempDir dir;
  make(dir, 300, 1, 32, 2);
  SpeculativeConfig c = draft_config(dir, 4);
  spec::DraftModelOptions o;
  o.backend.kind = "cpu";
  o.backend.threads = 1;
  o.num_blocks = 4;
  o.block_size = 4;
  o.max_batch_tokens = 5;  // a 7-token prompt is caught up in two pieces
  o.target_vocab = 300;
  spec::DraftModelProposer p(c, o);
  std::vector<TokenId> tokens{5, 6, 7, 8, 9, 10, 11};
  std::vector<TokenId> drafts, again;
  p.propose(spec::ProposeInput{1, "", tokens, 7, nullptr, {}, 0}, 4, drafts);
  REQUIRE(drafts.size() == 4);
  // Cached: the 7 tokens and the first 3 drafts (the last draft is never fed back).
  std::vector<TokenId> want = tokens;
  want.insert(want.end(), drafts.begin(), drafts.end() - 1);
  CHECK(p.cached_tokens(1) == want);
  CHECK(p.num_free_blocks() == 1);  // 10 positions in blocks of 4
  // Greedy drafts are a function of the tokens: the same proposal again.
  p.propose(spec::ProposeInput{1, "", tokens, 7, nullptr, {}, 0}, 4, again);
  CHECK(again == drafts);
  // One draft kept, then a token other than the second draft: the cache keeps 7 + 1 positions, then takes the
  // new token and the next drafts.
  tokens.push_back(drafts[0]);
  tokens.push_back((drafts[1] + 1) % 300);
  p.propose(spec::ProposeInput{1, "", tokens, 7, nullptr, {}, 0}, 2, again);
  REQUIRE(again.size() == 2);
  want = tokens;
  want.push_back(again[0]);
  CHECK(p.cached_tokens(1) == want);
  // The first draft rejected, then a plain step (no proposal): the rejected draft's position is recomputed
  // with the sequence's token.
  std::vector<TokenId> later = tokens;
  later.push_back((again[0] + 1) % 300);
  later.push_back(17);
  p.propose(spec::ProposeInput{1, "", later, 7, nullptr, {}, 0}, 1, drafts);
  REQUIRE(drafts.size() == 1);
  CHECK(p.cached_tokens(1) == later);
  // And its K/V are the sequence's: a fresh proposer drafts the same from the same tokens.
  {
    spec::DraftModelProposer fresh(c, o);
    std::vector<TokenId> from_scratch;
    fresh.propose(spec::ProposeInput{1, "", later, 7, nullptr, {}, 0}, 3, from_scratch);
    p.propose(spec::ProposeInput{1, "", later, 7, nullptr, {}, 0}, 3, drafts);
    CHECK(from_scratch == drafts);
  }
  // Another sequence that needs the whole pool takes it from the first (least recently used).
  std::vector<TokenId> other(14, 3);
  p.propose(spec::ProposeInput{2, "", other, 14, nullptr, {}, 0}, 3, drafts);
  CHECK(drafts.size() == 3);
  CHECK(p.cached_tokens(1).empty());
  CHECK(p.num_free_blocks() == 0);
  p.finish(spec::ProposeInput{2, "", other, 14, nullptr, {}, 0});
  CHECK(p.num_free_blocks() == 4);
  // A sequence longer than the pool proposes nothing.
  std::vector<TokenId> too_long(17, 4);
  p.propose(spec::ProposeInput{3, "", too_long, 17, nullptr, {}, 0}, 2, drafts);
  CHECK(drafts.empty());
  CHECK(p.num_free_blocks() == 4);
}

TEST_CASE("draft_model: sampled tokens follow the target's distribution (q from an unrelated draft model)") {
  constexpr std::int64_t kSmallVocab = 12;
  const auto vocab = static_cast<std::size_t>(kSmallVocab);
  test::TempDir target_dir, draft_dir;
  make(target_dir, kSmallVocab, 2, 64, 1);
  make(draft_dir, kSmallVocab, 1, 32, 5);
  const Model model = Model::load(target_dir.path());
  const Model draft = Model::load(draft_dir.path());
  const std::vector<TokenId> prompt{1, 2, 3, 4, 5};
  auto backend = make_backend(BackendOptions{});
  auto softmax_last = [&](const Model& m, const std::vector<TokenId>& ids) {
    const std::vector<float> all = all_position_logits(m, *backend, ids);
    const std::vector<float> last(all.end() - kSmallVocab, all.end());
    const float max_l = *std::max_element(last.begin(), last.end());
    std::vector<double> p(vocab);
    double z = 0.0;
    for (std::size_t i = 0; i < vocab; ++i) z += p[i] = std::exp(static_cast<double>(last[i] - max_l));
    for (double& x : p) x /= z;
    return p;
  };
  // The first output token comes from the prompt's prefill; the second is drafted by the draft model (q) and
  // verified. Its distribution: sum over t0 of p(t0 | prompt) p(t1 | prompt, t0); the expected acceptance:
  // sum over t0 of p(t0 | prompt) sum_x min(p, q)(x | prompt, t0).
  const std::vector<double> p0 = softmax_last(model, prompt);
  std::vector<double> p1(vocab, 0.0);
  double overlap = 0.0;
  for (std::size_t t0 = 0; t0 < vocab; ++t0) {
    std::vector<TokenId> ids = prompt;
    ids.push_back(static_cast<TokenId>(t0));
    const std::vector<double> p = softmax_last(model, ids), q = softmax_last(draft, ids);
    for (std::size_t x = 0; x < vocab; ++x) {
      p1[x] += p0[t0] * p[x];
      overlap += p0[t0] * std::min(p[x], q[x]);
    }
  }
  EngineConfig c = test::engine_config(256, 512, true);
  c.speculative = draft_config(draft_dir, 1);
  std::vector<GenerationRequest> requests;
  const int n = 4000;
  for (int s = 0; s < n; ++s) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 3;
    r.ignore_eos = true;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = static_cast<std::uint64_t>(s) * 7919 + 1;
    requests.push_back(r);
  }
  EngineStats stats;
  const auto got = test::run_requests(model, requests, c, false, &stats);
  CHECK(stats.spec.num_drafts == static_cast<std::uint64_t>(n));
  std::vector<double> count(vocab, 0.0);
  for (const auto& [i, r] : got) count[static_cast<std::size_t>(r.tokens.at(1))] += 1;
  CHECK(chi_square(count, p1, n) < 31.3);  // 11 degrees of freedom: p = 0.001
  // min(1, p/q) accepts sum min(p, q): far more than a point-mass rule's sum p q would.
  const double accept_rate = static_cast<double>(stats.spec.num_accepted_tokens) / n;
  CAPTURE(overlap);
  CHECK(std::abs(accept_rate - overlap) < 4 * std::sqrt(0.25 / n));
  // Seeded: the same tokens run for run.
  const auto again = test::run_requests(model, std::vector<GenerationRequest>(requests.begin(), requests.begin() + 200),
                                        c, true, nullptr);
  for (const auto& [i, r] : again) CHECK(got.at(i).tokens == r.tokens);
}

TEST_CASE("draft_model: a missing model directory or another vocabulary is refused at start") {
  test::TempDir target_dir, other_dir;
  make(target_dir, 300, 1, 32, 1);
  make(other_dir, 200, 1, 32, 1);
  const Model model = Model::load(target_dir.path());
  EngineConfig c = test::engine_config(16, 64, true);
  c.speculative = draft_config(target_dir, 2);
  c.speculative.draft_model = (target_dir / "missing").string();
  CHECK_THROWS_WITH_AS(Engine(model, c), doctest::Contains("speculative_config: model \""), std::invalid_argument);
  CHECK_THROWS_WITH_AS(Engine(model, c), doctest::Contains("cannot be loaded"), std::invalid_argument);
  c.speculative.draft_model = other_dir.path().string();
  CHECK_THROWS_WITH_AS(Engine(model, c), doctest::Contains("has a vocabulary of 200 tokens, the target model 300"),
                       std::invalid_argument);
}

TEST_CASE("draft_model: sampled requests report the target's logprobs, one per token, penalties included") {
  test::TempDir target_dir, draft_dir;
  make(target_dir, 300, 2, 64, 1);
  make(draft_dir, 300, 1, 32, 2);
  const Model model = Model::load(target_dir.path());
  std::vector<GenerationRequest> requests = test::equivalence_requests(300);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    requests[i].max_tokens = 12;
    requests[i].logprobs = 1;
    requests[i].sampling.temperature = 0.8f;
    requests[i].sampling.seed = i + 1;
    if (i % 3 == 0) requests[i].penalties.repetition = 1.3f;  // p over the drafts before each row
    if (i % 3 == 1) requests[i].penalties.frequency = 0.5f;
  }
  EngineConfig c = test::engine_config(64, 256, true);
  c.speculative = draft_config(draft_dir, 3);
  std::vector<std::vector<TokenId>> tokens(requests.size());
  std::vector<std::vector<float>> logprobs(requests.size());
  EngineStats stats;
  {
    Engine engine(model, c);
    std::mutex mu;
    for (std::size_t i = 0; i < requests.size(); ++i)
      engine.submit(requests[i], [&, i](const RequestOutput& o) {
        std::lock_guard lock(mu);
        CHECK(o.logprobs.size() == o.new_tokens.size());
        tokens[i].insert(tokens[i].end(), o.new_tokens.begin(), o.new_tokens.end());
        for (const auto& lp : o.logprobs) logprobs[i].push_back(lp.logprob);
      });
    engine.wait_idle();
    stats = engine.stats();
  }
  CHECK(stats.spec.num_accepted_tokens > 0);
  CHECK(stats.spec.num_draft_tokens > stats.spec.num_accepted_tokens);
  auto backend = make_backend(BackendOptions{});
  for (std::size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(i);
    REQUIRE(tokens[i].size() == 12);
    std::vector<TokenId> ids = requests[i].prompt;
    ids.insert(ids.end(), tokens[i].begin(), tokens[i].end() - 1);
    const std::vector<float> all = all_position_logits(model, *backend, ids);
    for (std::size_t t = 0; t < tokens[i].size(); ++t) {
      const std::size_t pos = requests[i].prompt.size() - 1 + t;
      const float* row = all.data() + pos * 300;
      const float max_l = *std::max_element(row, row + 300);
      double z = 0.0;
      for (std::size_t v = 0; v < 300; ++v) z += std::exp(static_cast<double>(row[v] - max_l));
      const double want = row[tokens[i][t]] - max_l - std::log(z);
      CHECK(std::abs(logprobs[i][t] - want) < 2e-3);
    }
  }
}
