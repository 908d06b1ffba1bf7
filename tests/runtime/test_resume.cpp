// Resumption (GenerationRequest::resumed_outputs): a request given the first k tokens of another run's output
// continues it exactly: the same tokens (greedy, seeded, with penalties), the same text, the same end,
// max_tokens counting the resumed tokens, and a stop string that spans the splice still found.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"
#include "kvfleet/tokenizer.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

struct Run {
  std::vector<TokenId> tokens;
  std::string text, resumed_text;
  FinishReason reason = FinishReason::none;
  std::string error;
};

Run generate(Engine& engine, const GenerationRequest& request) {
  std::mutex mu;
  Run run;
  engine.submit(request, [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    run.tokens.insert(run.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    run.text += o.text;
    run.resumed_text += o.resumed_text;
    if (o.finished) {
      run.reason = o.finish_reason;
      run.error = o.error;
    }
  });
  engine.wait_idle();
  return run;
}

GenerationRequest resumed(GenerationRequest r, const Run& full, std::size_t k) {
  r.resumed_outputs.assign(full.tokens.begin(), full.tokens.begin() + static_cast<std::ptrdiff_t>(k));
  return r;
}

struct Fixture {
  Fixture() : tok(Tokenizer::load(std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default")) {
    MakeModelOptions o;
    o.vocab = static_cast<std::int64_t>(tok.vocab_size());
    o.layers = 1;
    o.hidden = 32;
    o.intermediate = 64;
    make_model(o, dir.path());
    model.emplace(Model::load(dir.path()));
    EngineConfig c;
    c.num_blocks = 64;
    c.backend.kind = "cpu";
    c.backend.threads = 1;
    engine.emplace(*model, c);
    engine->set_tokenizer(&tok);
  }
  Tokenizer tok;
  test::TempDir dir;
  std::optional<Model> model;
  std::optional<Engine> engine;
};

GenerationRequest base_request() {
  GenerationRequest r;
  r.prompt = {11, 20, 300, 4000, 17};
  r.max_tokens = 20;
  r.ignore_eos = true;
  r.detokenize = true;
  return r;
}

}  // namespace

TEST_CASE("resumed outputs: greedy, seeded and penalized runs continue token for token") {
  Fixture f;
  std::vector<std::pair<const char*, GenerationRequest>> cases;
  cases.emplace_back("greedy", base_request());
  GenerationRequest seeded = base_request();
  seeded.sampling.temperature = 1.0f;
  seeded.sampling.top_k = 40;
  seeded.sampling.seed = 7;
  cases.emplace_back("seeded", seeded);
  GenerationRequest penalized = seeded;
  penalized.penalties = {0.5f, 0.7f, 1.3f};
  penalized.logprobs = 2;
  cases.emplace_back("seeded, penalties, logprobs", penalized);
  for (const auto& [name, request] : cases) {
    CAPTURE(name);
    const Run full = generate(*f.engine, request);
    REQUIRE(full.tokens.size() == 20);
    REQUIRE(full.reason == FinishReason::length);
    for (std::size_t k : {std::size_t{1}, std::size_t{9}, std::size_t{19}}) {
      CAPTURE(k);
      const Run rest = generate(*f.engine, resumed(request, full, k));
      CHECK(rest.tokens == std::vector<TokenId>(full.tokens.begin() + static_cast<std::ptrdiff_t>(k), full.tokens.end()));
      CHECK(rest.reason == FinishReason::length);  // max_tokens counts the resumed tokens
      CHECK(rest.resumed_text + rest.text == full.text);
      CHECK(rest.resumed_text == f.tok.decode(std::vector<TokenId>(full.tokens.begin(), full.tokens.begin() + static_cast<std::ptrdiff_t>(k)), false));
    }
  }
}

TEST_CASE("resumed outputs: a stop string spanning the splice is found; the text held back is shown once") {
  Fixture f;
  GenerationRequest r = base_request();
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 3;
  const Run full = generate(*f.engine, r);
  REQUIRE(full.tokens.size() == 20);
  // The splice after token k; a stop string from 2 bytes before its text ends to 2 bytes after.
  std::size_t k = 8, at = 0;
  std::string stop;
  for (; k < 16; ++k) {
    const std::string before = f.tok.decode(std::vector<TokenId>(full.tokens.begin(), full.tokens.begin() + static_cast<std::ptrdiff_t>(k)), false);
    if (before.size() < 2 || before.size() + 2 > full.text.size()) continue;
    at = before.size() - 2;
    stop = full.text.substr(at, 4);
    if (full.text.find(stop) == at) break;
  }
  REQUIRE(k < 16);
  r.stop = {stop};
  const Run cut = generate(*f.engine, r);
  REQUIRE(cut.reason == FinishReason::stop);
  REQUIRE(cut.text == full.text.substr(0, at));
  const Run rest = generate(*f.engine, resumed(r, full, k));
  CHECK(rest.reason == FinishReason::stop);
  CHECK(rest.resumed_text + rest.text == cut.text);
  CHECK(rest.tokens == std::vector<TokenId>(cut.tokens.begin() + static_cast<std::ptrdiff_t>(k), cut.tokens.end()));
  // The bytes held back for the stop string were not in the resumed text: the part before the stop comes
  // in the continuation.
  CHECK(rest.resumed_text.size() <= at);
}

TEST_CASE("resumed outputs: bad ones are refused") {
  Fixture f;
  GenerationRequest r = base_request();
  r.max_tokens = 3;
  r.resumed_outputs = {1, 2, 3};
  CHECK_THROWS_WITH_AS(f.engine->submit(r, nullptr), doctest::Contains("max_tokens"), std::invalid_argument);
  r.max_tokens = 10;
  r.resumed_outputs = {1, -4};
  CHECK_THROWS_WITH_AS(f.engine->submit(r, nullptr), doctest::Contains("outside the vocabulary"), std::invalid_argument);
  // Outputs that hold a stop token id would have ended the request: it ends at once, with the error.
  r.resumed_outputs = {1, 2};
  r.stop_token_ids = {2};
  const Run run = generate(*f.engine, r);
  CHECK(run.reason == FinishReason::aborted);
  CHECK(run.error.find("would have ended") != std::string::npos);
  CHECK(run.tokens.empty());
}
