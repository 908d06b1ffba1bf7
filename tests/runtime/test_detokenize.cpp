// The engine decodes a request's output once (GenerationRequest::detokenize), on its own thread, with the
// decoder its stop strings are matched on; the server streams RequestOutput::text instead of decoding again.
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
  std::string text;
  std::string stop_string;
  FinishReason reason = FinishReason::none;
  int outputs = 0;
};

std::vector<Run> generate(Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::mutex mu;
  std::vector<Run> runs(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i)
    engine.submit(requests[i], [&mu, &runs, i](const RequestOutput& o) {
      std::lock_guard lock(mu);
      Run& r = runs[i];
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      r.text += o.text;
      ++r.outputs;
      if (o.finished) {
        r.reason = o.finish_reason;
        r.stop_string = o.stop_string;
      }
    });
  engine.wait_idle();
  return runs;
}

}  // namespace

TEST_CASE("detokenize: the outputs' text is the decode of their tokens; stop strings match that text") {
  const std::string model_dir = std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default";
  const Tokenizer tok = Tokenizer::load(model_dir);
  test::TempDir dir;
  MakeModelOptions o;
  o.vocab = static_cast<std::int64_t>(tok.vocab_size());
  o.layers = 1;
  o.hidden = 32;
  o.intermediate = 64;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  EngineConfig c;
  c.num_blocks = 64;
  c.backend.kind = "cpu";
  c.backend.threads = 1;
  Engine engine(model, c);
  CHECK_THROWS_WITH_AS(engine.submit([] { GenerationRequest r; r.prompt = {1}; r.detokenize = true; return r; }(), nullptr),
                       doctest::Contains("tokenizer"), std::invalid_argument);
  engine.set_tokenizer(&tok);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.prompt = {1 + i, 20, 300};
    r.max_tokens = 24;
    r.ignore_eos = true;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = static_cast<std::uint64_t>(i);
    r.detokenize = true;
    r.skip_special_tokens = i % 2 == 0;
    requests.push_back(r);
  }
  const std::vector<Run> runs = generate(engine, requests);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    CAPTURE(i);
    REQUIRE(runs[i].tokens.size() == 24);
    CHECK(runs[i].outputs == 24);
    CHECK(runs[i].text == tok.decode(runs[i].tokens, requests[i].skip_special_tokens));
    CHECK(!runs[i].text.empty());
  }
  // A stop string taken from the middle of run 1's text ends the same generation there, found in the
  // text the engine decoded; the text shown ends just before the stop string's first occurrence.
  const std::string& full = runs[1].text;
  REQUIRE(full.size() > 8);
  const std::string stop = full.substr(full.size() / 2, 3);
  GenerationRequest r = requests[1];
  r.stop = {stop};
  const Run cut = generate(engine, {r}).at(0);
  CHECK(cut.reason == FinishReason::stop);
  CHECK(cut.stop_string == stop);
  CHECK(cut.text == full.substr(0, full.find(stop)));
  CHECK(full.compare(0, cut.text.size() + stop.size(), cut.text + stop) == 0);  // the same tokens up to the stop
  CHECK(cut.tokens.size() < runs[1].tokens.size());
}
