// Speculative decoding in the engine: the output is the same token for token as without it (greedy and
// seeded sampling, dense and MoE, batched, chunked, cached, preempted, mixed with plain sequences), rejected
// drafts leave no trace in the KV cache or its events, stops and lengths are exact, and the sampled path
// follows the model's distribution.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <set>
#include <thread>

#include "kvfleet/communicator.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"
#include "kvfleet/tokenizer.h"
#include "runtime/engine_harness.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

constexpr std::int32_t kVocab = 300;

Model make(const test::TempDir& dir, const std::string& arch, std::int64_t vocab = kVocab) {
  MakeModelOptions o;
  o.arch = arch;
  o.dtype = DType::bf16;
  o.vocab = vocab;
  o.layers = 2;
  make_model(o, dir.path());
  return Model::load(dir.path());
}

SpeculativeConfig ngram(std::int32_t k, std::int32_t min_n, std::int32_t max_n) {
  SpeculativeConfig s;
  s.method = "ngram";
  s.num_speculative_tokens = k;
  s.prompt_lookup_min = min_n;
  s.prompt_lookup_max = max_n;
  s.disable_by_batch_size = 64;
  return s;
}

SpeculativeConfig suffix(std::int32_t k, std::int32_t cached = 1000) {
  SpeculativeConfig s;
  s.method = "suffix";
  s.num_speculative_tokens = k;
  s.suffix_max_cached_requests = cached;
  s.disable_by_batch_size = 64;
  return s;
}

// Proposes the reference output's next tokens (request i is engine id i + 1), wrong at every third
// position, and nothing for every fourth request: full accepts, partial rejects and plain decodes, mixed.
auto oracle(const std::map<std::size_t, test::Collected>& ref) {
  return [&ref](const Sequence& seq, std::int32_t k, std::vector<TokenId>& out) {
    const std::size_t i = seq.id - 1;
    if (i % 4 == 3) return;
    const std::vector<TokenId>& want = ref.at(i).tokens;
    for (std::int32_t j = 0; j < k; ++j) {
      const auto p = static_cast<std::size_t>(seq.num_output_tokens() + j);
      TokenId t = p < want.size() ? want[p] : static_cast<TokenId>((p * 7) % kVocab);
      if (p % 3 == 2) t = (t + 1) % kVocab;
      out.push_back(t);
    }
  };
}

// Runs the requests (all at once, or one after another), checking the scheduler's and the KV cache's
// integrity between steps while they run.
std::map<std::size_t, test::Collected> run_checked(const Model& model, const std::vector<GenerationRequest>& requests,
                                                   const EngineConfig& c, bool one_at_a_time, EngineStats* stats,
                                                   std::vector<KvEvent>* events = nullptr) {
  Engine engine(model, c);
  test::Collector col;
  std::atomic<int> checks{0};
  std::mutex mu;
  std::string broken;
  auto check = [&] {
    engine.run_kv_task([&](Scheduler& s, Backend&) {
      if (std::string e = s.check_integrity(); !e.empty()) {
        std::lock_guard lock(mu);
        broken = e;
      }
      ++checks;
    });
  };
  for (std::size_t i = 0; i < requests.size(); ++i) {
    engine.submit(requests[i], col.callback(i));
    check();
    if (one_at_a_time) engine.wait_idle();
  }
  for (int n = 0; n < 200; ++n) {
    check();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  engine.wait_idle();
  check();
  engine.wait_idle();
  CHECK_MESSAGE(broken.empty(), broken);
  CHECK(checks.load() > 0);
  if (stats) *stats = engine.stats();
  const auto kv = engine.stats().scheduler.kv;
  CHECK_MESSAGE(kv.num_free_blocks == kv.num_blocks, "blocks leaked");
  if (events) *events = engine.kv_events()->since(0).events;
  return col.results();
}

void check_speculation_is_exact(const std::string& arch) {
  test::TempDir dir;
  const Model model = make(dir, arch);
  const std::vector<GenerationRequest> requests = test::equivalence_requests(kVocab);
  // Longer outputs than the equivalence workload's, so that drafts get verified many times.
  std::vector<GenerationRequest> longer = requests;
  for (std::size_t i = 0; i < longer.size(); ++i) longer[i].max_tokens = 4 + static_cast<std::int32_t>(i % 5) * 6;
  const auto alone = test::run_requests(model, longer, test::engine_config(64, 256, false), true, nullptr);
  struct Case {
    const char* name;
    EngineConfig c;
  };
  auto with = [](EngineConfig c, SpeculativeConfig s) {
    c.speculative = s;
    return c;
  };
  for (const char* method : {"oracle", "ngram", "suffix"}) {
    const bool use_oracle = std::string(method) == "oracle";
    const SpeculativeConfig s = use_oracle ? ngram(4, 1, 3) : std::string(method) == "ngram" ? ngram(3, 1, 2) : suffix(4);
    std::vector<Case> cases{
        {"batched, prefix cache", with(test::engine_config(64, 256, true), s)},
        {"chunked prefill", with(test::engine_config(64, 24, true), s)},
        {"small cache: preemption", with(test::engine_config(14, 256, true), s)},
        {"no prefix cache", with(test::engine_config(64, 64, false), s)},
    };
    for (Case& cs : cases) {
      CAPTURE(method);
      if (use_oracle) cs.c.propose_for_test = oracle(alone);
      EngineStats stats;
      const auto got = run_checked(model, longer, cs.c, false, &stats);
      test::check_equals_alone(cs.name, alone, got, stats);
      CHECK(stats.spec.num_drafts > 0);
      CHECK(stats.spec.num_draft_tokens > stats.spec.num_accepted_tokens);  // some rejected
      if (use_oracle) CHECK(stats.spec.num_accepted_tokens > 0);
      std::uint64_t generated = 0;
      for (const auto& [i, c] : got) generated += c.tokens.size();
      CHECK(stats.generated_tokens == generated);
    }
  }
}

}  // namespace

TEST_CASE("speculation: greedy and seeded outputs equal speculation off, token for token (dense)") {
  check_speculation_is_exact("llama");
}

TEST_CASE("speculation: greedy and seeded outputs equal speculation off, token for token (MoE)") {
  check_speculation_is_exact("qwen2_moe");
}

TEST_CASE("speculation: rejected drafts publish no KV event; the cache holds what it holds without them") {
  test::TempDir dir;
  const Model model = make(dir, "llama");
  std::vector<GenerationRequest> requests = test::equivalence_requests(kVocab);
  for (auto& r : requests) r.max_tokens = 40;  // several blocks of output each
  std::vector<KvEvent> plain_events, spec_events;
  EngineStats stats;
  const auto plain = run_checked(model, requests, test::engine_config(512, 256, true), true, nullptr, &plain_events);
  EngineConfig c = test::engine_config(512, 256, true);
  c.speculative = ngram(4, 1, 3);
  c.propose_for_test = oracle(plain);
  const auto got = run_checked(model, requests, c, true, &stats, &spec_events);
  for (const auto& [i, r] : plain) CHECK(got.at(i).tokens == r.tokens);
  CHECK(stats.spec.num_accepted_tokens > 0);
  CHECK(stats.spec.num_draft_tokens > stats.spec.num_accepted_tokens);
  // The same blocks stored in the same order (a commit may store several at once), none removed.
  auto stored = [](const std::vector<KvEvent>& events) {
    std::vector<BlockHash> out;
    for (const KvEvent& e : events) {
      CHECK(e.type == KvEvent::Type::stored);
      out.insert(out.end(), e.block_hashes.begin(), e.block_hashes.end());
    }
    return out;
  };
  CHECK(stored(spec_events) == stored(plain_events));
  CHECK(!stored(plain_events).empty());
}

TEST_CASE("speculation: stop strings, stop ids and max_tokens end the output exactly where they do without it") {
  const std::string model_dir = std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default";
  const Tokenizer tok = Tokenizer::load(model_dir);
  const Model model = Model::load(model_dir);
  struct Run {
    std::vector<TokenId> tokens;
    std::string text, stop_string;
    FinishReason reason = FinishReason::none;
    int finals = 0;
  };
  auto generate = [&](const EngineConfig& c, const std::vector<GenerationRequest>& requests, EngineStats* stats) {
    Engine engine(model, c);
    engine.set_tokenizer(&tok);
    std::mutex mu;
    std::vector<Run> runs(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i)
      engine.submit(requests[i], [&mu, &runs, i](const RequestOutput& o) {
        std::lock_guard lock(mu);
        runs[i].tokens.insert(runs[i].tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
        runs[i].text += o.text;
        if (o.finished) {
          runs[i].reason = o.finish_reason;
          runs[i].stop_string = o.stop_string;
          ++runs[i].finals;
        }
      });
    engine.wait_idle();
    if (stats) *stats = engine.stats();
    return runs;
  };
  EngineConfig plain_config = test::engine_config(256, 256, true);
  // A prompt whose greedy continuation falls into a loop within its first 30 tokens (the trained default
  // model repeats its own line): prompt lookup's drafts get accepted.
  const std::string line = "And God said, Let there be light: and there was light.\n";
  std::string prompt_text;
  for (int i = 0; i < 5; ++i) prompt_text += line;
  GenerationRequest base;
  base.prompt = tok.encode(prompt_text);
  base.max_tokens = 64;
  base.detokenize = true;
  base.sampling.temperature = 0.0f;
  const auto reference = generate(plain_config, {base}, nullptr)[0];
  REQUIRE(reference.tokens.size() > 8);
  std::vector<GenerationRequest> requests;
  for (std::int32_t m : {1, 2, 3, 5, 31, 33, 37, 41, 64}) {  // max_tokens inside a run of accepted drafts
    GenerationRequest r = base;
    r.max_tokens = m;
    requests.push_back(r);
  }
  for (std::size_t at : {std::size_t{3}, std::size_t{6}, reference.text.size() / 2, reference.text.size() - 8}) {  // stop strings
    if (at + 3 > reference.text.size()) continue;
    GenerationRequest r = base;
    r.stop = {reference.text.substr(at, 3)};
    requests.push_back(r);
  }
  for (std::size_t at : {std::size_t{2}, std::size_t{5}, std::size_t{40}}) {  // stop ids from the output
    GenerationRequest r = base;
    r.stop_token_ids = {reference.tokens[at]};
    requests.push_back(r);
  }
  const auto want = generate(plain_config, requests, nullptr);
  EngineConfig spec_config = plain_config;
  spec_config.speculative = ngram(5, 1, 4);
  EngineStats stats;
  const auto got = generate(spec_config, requests, &stats);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].tokens == want[i].tokens);
    CHECK(got[i].text == want[i].text);
    CHECK(got[i].reason == want[i].reason);
    CHECK(got[i].stop_string == want[i].stop_string);
    CHECK(got[i].finals == 1);
  }
  CHECK(stats.spec.num_accepted_tokens > 0);
}

TEST_CASE("speculation: sampled tokens follow the model's distribution (a draft the model rarely picks)") {
  constexpr std::int64_t kSmallVocab = 12;
  const auto vocab = static_cast<std::size_t>(kSmallVocab);
  test::TempDir dir;
  const Model model = make(dir, "llama", kSmallVocab);
  const std::vector<TokenId> prompt{1, 2, 3, 4, 5};
  // The first output token comes from the prompt's prefill (never speculated); the second is drafted. Its
  // distribution: sum over t0 of p(t0 | prompt) p(t1 | prompt, t0), from the model's own logits.
  auto backend = make_backend(BackendOptions{});
  auto softmax_last = [&](const std::vector<TokenId>& ids) {
    const std::vector<float> all = all_position_logits(model, *backend, ids);
    const std::vector<float> last(all.end() - kSmallVocab, all.end());
    const float max_l = *std::max_element(last.begin(), last.end());
    std::vector<double> p(vocab);
    double z = 0.0;
    for (std::size_t i = 0; i < vocab; ++i) z += p[i] = std::exp(static_cast<double>(last[i] - max_l));
    for (double& x : p) x /= z;
    return p;
  };
  const std::vector<double> p0 = softmax_last(prompt);
  std::vector<double> p1(vocab, 0.0);
  for (std::size_t t0 = 0; t0 < vocab; ++t0) {
    std::vector<TokenId> ids = prompt;
    ids.push_back(static_cast<TokenId>(t0));
    const std::vector<double> q = softmax_last(ids);
    for (std::size_t x = 0; x < vocab; ++x) p1[x] += p0[t0] * q[x];
  }
  // The draft: the second least likely second token, so that most drafts are rejected and the residual matters.
  std::vector<std::size_t> order(vocab);
  for (std::size_t i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p1[a] < p1[b]; });
  const auto draft = static_cast<TokenId>(order[1]);
  EngineConfig c = test::engine_config(256, 512, true);
  c.speculative = ngram(1, 1, 1);
  c.propose_for_test = [&](const Sequence& seq, std::int32_t, std::vector<TokenId>& out) {
    if (seq.num_output_tokens() == 1) out.assign(1, draft);
  };
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
  double chi = 0.0;
  for (std::size_t i = 0; i < vocab; ++i) chi += (count[i] - n * p1[i]) * (count[i] - n * p1[i]) / (n * p1[i]);
  CAPTURE(p1[static_cast<std::size_t>(draft)]);
  CAPTURE(count[static_cast<std::size_t>(draft)]);
  CHECK(chi < 31.3);  // 11 degrees of freedom: p = 0.001
  const double accept_rate = static_cast<double>(stats.spec.num_accepted_tokens) / n;
  CHECK(std::abs(accept_rate - p1[static_cast<std::size_t>(draft)]) < 4 * std::sqrt(0.25 / n));
  // And the same tokens as speculation off, seed for seed.
  EngineConfig off = c;
  off.speculative = {};
  const auto plain = test::run_requests(model, requests, off, false, nullptr);
  for (const auto& [i, r] : plain) CHECK(got.at(i).tokens == r.tokens);
}

TEST_CASE("speculation: logprobs are the target model's, one entry per token, as without it") {
  test::TempDir dir;
  const Model model = make(dir, "llama");
  std::vector<GenerationRequest> requests = test::equivalence_requests(kVocab);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    requests[i].max_tokens = 12;
    requests[i].logprobs = static_cast<std::int32_t>(i % 3);
    if (i % 5 == 0) requests[i].penalties.repetition = 1.3f;  // penalties over the drafts before each row
    if (i % 5 == 1) requests[i].penalties.frequency = 0.5f;
  }
  struct Run {
    std::vector<TokenId> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<TokenId>> top;
  };
  auto generate = [&](const EngineConfig& c, EngineStats* stats) {
    Engine engine(model, c);
    std::mutex mu;
    std::vector<Run> runs(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i)
      engine.submit(requests[i], [&mu, &runs, i](const RequestOutput& o) {
        std::lock_guard lock(mu);
        CHECK(o.logprobs.size() == o.new_tokens.size());
        runs[i].tokens.insert(runs[i].tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
        for (const auto& lp : o.logprobs) {
          runs[i].logprobs.push_back(lp.logprob);
          runs[i].top.emplace_back();
          for (const TokenLogprob& t : lp.top) runs[i].top.back().push_back(t.id);
        }
      });
    engine.wait_idle();
    if (stats) *stats = engine.stats();
    return runs;
  };
  const auto plain = generate(test::engine_config(64, 256, true), nullptr);
  std::map<std::size_t, test::Collected> ref;
  for (std::size_t i = 0; i < plain.size(); ++i) ref[i].tokens = plain[i].tokens;
  EngineConfig c = test::engine_config(64, 256, true);
  c.speculative = ngram(4, 1, 3);
  c.propose_for_test = oracle(ref);
  EngineStats stats;
  const auto got = generate(c, &stats);
  CHECK(stats.spec.num_accepted_tokens > 0);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].tokens == plain[i].tokens);
    CHECK(got[i].logprobs == plain[i].logprobs);
    CHECK(got[i].top == plain[i].top);
  }
}

TEST_CASE("speculation: refused with expert parallelism") {
  test::TempDir dir;
  const Model model = make(dir, "qwen2_moe");
  auto comms = make_in_process_group(2);
  EngineConfig c = test::engine_config(64, 256, true);
  c.speculative = ngram(2, 1, 2);
  c.ep = comms[0].get();
  CHECK_THROWS_WITH_AS(Engine(model, c), doctest::Contains("not supported with expert parallelism"), std::invalid_argument);
}

TEST_CASE("speculation switches itself off: per step above disable_by_batch_size, per sequence after rejections") {
  test::TempDir dir;
  const Model model = make(dir, "llama");
  std::vector<GenerationRequest> requests = test::equivalence_requests(kVocab);
  for (auto& r : requests) r.max_tokens = 20;
  const auto plain = test::run_requests(model, requests, test::engine_config(128, 256, true), false, nullptr);
  // A step with at least one running sequence never speculates at disable_by_batch_size 1.
  EngineConfig c = test::engine_config(128, 256, true);
  c.speculative = ngram(4, 1, 3);
  c.speculative.disable_by_batch_size = 1;
  c.propose_for_test = oracle(plain);
  EngineStats stats;
  auto got = test::run_requests(model, requests, c, false, &stats);
  CHECK(stats.spec.num_drafts == 0);
  for (const auto& [i, r] : plain) CHECK(got.at(i).tokens == r.tokens);
  // Always wrong drafts: the sequence stops proposing after two rejected steps, for 16 steps, then 32, ...
  GenerationRequest one = requests[0];
  one.max_tokens = 200;
  const auto ref = test::run_requests(model, {one}, test::engine_config(128, 256, true), false, nullptr);
  EngineConfig wrong = test::engine_config(128, 256, true);
  wrong.speculative = ngram(4, 1, 3);
  wrong.propose_for_test = [&](const Sequence& seq, std::int32_t k, std::vector<TokenId>& out) {
    const auto p = static_cast<std::size_t>(seq.num_output_tokens());
    for (std::int32_t j = 0; j < k; ++j) out.push_back((ref.at(0).tokens.at(p + static_cast<std::size_t>(j)) + 1) % kVocab);
  };
  got = test::run_requests(model, {one}, wrong, false, &stats);
  CHECK(got.at(0).tokens == ref.at(0).tokens);
  CHECK(stats.spec.num_accepted_tokens == 0);
  CHECK(stats.spec.num_drafts >= 2);
  CHECK(stats.spec.num_drafts <= 12);  // 2 + 2 + 2 + 2 + 2 within 2 + 16 + 2 + 32 + 2 + 64 + 2 + 128 steps
}

// Suffix decoding's agent loop: the same steps again (tool calls repeating earlier ones) draft from the
// earlier requests' outputs; greedy and seeded outputs stay those of speculation off; a request of another
// cache salt gets no draft from them.
TEST_CASE("suffix speculation: earlier outputs draft repeated steps, outputs unchanged, salts isolated") {
  test::TempDir dir;
  const Model model = make(dir, "llama");
  std::vector<GenerationRequest> requests = test::equivalence_requests(kVocab);
  for (auto& r : requests) r.max_tokens = 30;
  const auto alone = test::run_requests(model, requests, test::engine_config(256, 256, true), true, nullptr);
  std::vector<GenerationRequest> twice = requests;
  twice.insert(twice.end(), requests.begin(), requests.end());
  for (const bool small_cache : {false, true}) {
    CAPTURE(small_cache);
    EngineConfig c = test::engine_config(small_cache ? 14 : 256, small_cache ? 24 : 256, true);
    c.speculative = suffix(8);
    EngineStats once_stats, twice_stats;
    run_checked(model, requests, c, true, &once_stats);
    const auto got = run_checked(model, twice, c, true, &twice_stats);
    for (std::size_t i = 0; i < twice.size(); ++i) {
      CAPTURE(i);
      CHECK(got.at(i).tokens == alone.at(i % requests.size()).tokens);
    }
    // The second pass: its own outputs are in the tree, drafts accepted for most of its tokens.
    const std::uint64_t second_accepted = twice_stats.spec.num_accepted_tokens - once_stats.spec.num_accepted_tokens;
    std::uint64_t second_generated = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) second_generated += alone.at(i).tokens.size();
    CAPTURE(second_accepted);
    CAPTURE(second_generated);
    CHECK(second_accepted * 2 > second_generated);
  }
  // Salts: request 0 under salt "a", then its twin under salt "b" speculates exactly as on a fresh engine
  // (its own tokens only); under salt "a" again it drafts from the first's outputs.
  EngineConfig c = test::engine_config(256, 256, true);
  c.speculative = suffix(8);
  GenerationRequest a = requests[0], b = requests[0], a2 = requests[0];
  a.cache_salt = "a";
  b.cache_salt = "b";
  a2.cache_salt = "a";
  EngineStats first, fresh, other, same;
  run_checked(model, {a}, c, true, &first);
  const auto got_fresh = run_checked(model, {b}, c, true, &fresh);
  const auto got_other = run_checked(model, {a, b}, c, true, &other);
  const auto got_same = run_checked(model, {a, a2}, c, true, &same);
  CHECK(got_other.at(1).tokens == got_fresh.at(0).tokens);
  CHECK(got_same.at(1).tokens == got_fresh.at(0).tokens);
  CHECK(other.spec.num_drafts - first.spec.num_drafts == fresh.spec.num_drafts);
  CHECK(other.spec.num_draft_tokens - first.spec.num_draft_tokens == fresh.spec.num_draft_tokens);
  CHECK(other.spec.num_accepted_tokens - first.spec.num_accepted_tokens == fresh.spec.num_accepted_tokens);
  CHECK(same.spec.num_accepted_tokens - first.spec.num_accepted_tokens > fresh.spec.num_accepted_tokens + 10);
}
