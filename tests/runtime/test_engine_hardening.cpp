// What a single request must never do to the engine: crash its thread (a prompt the scheduler cannot
// take, a failing step), sample ids the tokenizer cannot show, or share a tenant's cached prefix.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>

#include "runtime/engine_harness.h"
#include "kvfleet/make_model.h"
#include "kvfleet/tokenizer.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

const std::string kDefaultModel = std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default";

// The default model's 4,096-token tokenizer on a model whose embedding has 16,384 rows: three quarters
// of the ids are padding, as Qwen2's 151,936 rows are for 151,665 tokens.
Model padded_model(const test::TempDir& dir) {
  MakeModelOptions o;
  o.vocab = 16384;
  o.layers = 1;
  o.hidden = 32;
  o.intermediate = 64;
  o.heads = 2;
  o.kv_heads = 1;
  o.tokenizer = kDefaultModel;
  make_model(o, dir.path());
  return Model::load(dir.path());
}

Model small_model(const test::TempDir& dir) {
  MakeModelOptions o;
  o.vocab = 300;
  o.layers = 1;
  make_model(o, dir.path());
  return Model::load(dir.path());
}

// A model whose lm_head is all NaN (f32): every logit row the engine sees is NaN.
Model nan_model(const test::TempDir& dir) {
  MakeModelOptions o;
  o.vocab = 300;
  o.layers = 1;
  make_model(o, dir.path());
  const auto file = dir.path() / "model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  std::uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const auto offsets = boost::json::parse(header).at("lm_head.weight").at("data_offsets").as_array();
  const auto begin = offsets[0].to_number<std::uint64_t>(), end = offsets[1].to_number<std::uint64_t>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  f.seekp(static_cast<std::streamoff>(8 + header_len + begin));
  for (std::uint64_t at = begin; at < end; at += 4) f.write(reinterpret_cast<const char*>(&nan), 4);
  f.close();
  return Model::load(dir.path());
}

EngineConfig cpu_config() {
  EngineConfig c;
  c.num_blocks = 64;
  c.backend.kind = "cpu";
  c.backend.threads = 1;
  return c;
}

GenerationRequest request(std::vector<TokenId> prompt, std::int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

}  // namespace

TEST_CASE("a prompt longer than max_num_batched_tokens without chunked prefill is refused at submit") {
  test::TempDir dir;
  const Model model = small_model(dir);
  EngineConfig c = cpu_config();
  c.scheduler.enable_chunked_prefill = false;
  c.scheduler.max_num_batched_tokens = 32;
  Engine engine(model, c);
  test::Collector col;
  // Before: accepted, then Scheduler::add threw on the engine thread (std::terminate).
  CHECK_THROWS_WITH_AS(engine.submit(request(std::vector<TokenId>(40, 7), 2), col.callback(0)),
                       doctest::Contains("max_num_batched_tokens"), std::invalid_argument);
  engine.submit(request(std::vector<TokenId>(20, 7), 3), col.callback(1));
  engine.wait_idle();
  CHECK(col.results().at(1).tokens.size() == 3);
}

TEST_CASE("ids past the tokenizer (padded embedding rows) are never sampled, greedy or not") {
  test::TempDir dir;
  const Model model = padded_model(dir);
  const Tokenizer tok = Tokenizer::load(kDefaultModel);
  REQUIRE(tok.vocab_size() == 4096);
  REQUIRE(model.config().vocab_size == 16384);
  Engine engine(model, cpu_config());
  engine.set_tokenizer(&tok);
  test::Collector col;
  for (std::size_t i = 0; i < 6; ++i) {
    GenerationRequest r = request({1, 2, 3, static_cast<TokenId>(i)}, 24);
    r.sampling.temperature = i == 0 ? 0.0f : 1.0f;
    r.sampling.seed = i;
    r.logprobs = 3;
    engine.submit(r, col.callback(i));
  }
  engine.wait_idle();
  for (const auto& [id, c] : col.results()) {
    const auto request_id = id;  // clang 14 cannot capture a structured binding in CAPTURE's lambda
    CAPTURE(request_id);
    REQUIRE(c.tokens.size() == 24);
    for (TokenId t : c.tokens) CHECK(t < 4096);
  }
}

TEST_CASE("logprobs are the raw logits' even when logit_bias and penalties change what is sampled") {
  test::TempDir dir;
  const Model model = small_model(dir);
  Engine engine(model, cpu_config());
  std::mutex mu;
  std::map<int, std::vector<RequestOutput::Logprobs>> lps;
  std::map<int, std::vector<TokenId>> toks;
  auto collect = [&](int i) {
    return [&, i](const RequestOutput& o) {
      std::lock_guard lock(mu);
      lps[i].insert(lps[i].end(), o.logprobs.begin(), o.logprobs.end());
      toks[i].insert(toks[i].end(), o.new_tokens.begin(), o.new_tokens.end());
    };
  };
  GenerationRequest plain = request({5, 6, 7, 8}, 1);
  plain.sampling.temperature = 0.0f;
  plain.logprobs = 300;  // every id: the raw distribution of the first token
  GenerationRequest biased = plain;
  biased.logprobs = 3;
  biased.logit_bias = {{7, 100.0f}};
  biased.penalties.repetition = 1.5f;  // 7 is in the prompt: penalised too, before the draw
  engine.submit(plain, collect(0));
  engine.submit(biased, collect(1));
  engine.wait_idle();
  REQUIRE(toks[1] == std::vector<TokenId>{7});
  REQUIRE(lps[0].size() == 1);
  REQUIRE(lps[1].size() == 1);
  const auto& all = lps[0][0].top;
  REQUIRE(all.size() == 300);
  float raw7 = 0.0f;
  for (const auto& t : all)
    if (t.id == 7) raw7 = t.logprob;
  CHECK(lps[1][0].logprob == doctest::Approx(raw7).epsilon(1e-6));
  CHECK(raw7 < -0.5f);  // not the ~0 of the biased distribution
  REQUIRE(lps[1][0].top.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(lps[1][0].top[k].id == all[k].id);
    CHECK(lps[1][0].top[k].logprob == all[k].logprob);
  }
  CHECK(lps[0][0].logprob == all[0].logprob);  // greedy, unbiased: the chosen token is the top one
}

TEST_CASE("cache_salt: requests of different salts never share cached blocks; the same salt does") {
  test::TempDir dir;
  const Model model = small_model(dir);
  Engine engine(model, cpu_config());
  std::vector<TokenId> prompt(64);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(i % 290);
  auto cached = [&](const std::string& salt) {
    test::Collector col;
    GenerationRequest r = request(prompt, 1);
    r.cache_salt = salt;
    engine.submit(r, col.callback(0));
    engine.wait_idle();
    return col.results().at(0).cached_tokens;
  };
  CHECK(cached("") == 0);
  CHECK(cached("") == 48);  // three of its four blocks (the last token is always computed)
  CHECK(cached("tenant-a") == 0);
  CHECK(cached("tenant-b") == 0);
  CHECK(cached("tenant-a") == 48);
  CHECK(cached("") == 48);
}

TEST_CASE("logit_bias moves sampling; abort_all ends every request with its error") {
  test::TempDir dir;
  const Model model = small_model(dir);
  Engine engine(model, cpu_config());
  test::Collector col;
  GenerationRequest r = request({5, 6, 7}, 6);
  r.sampling.temperature = 0.0f;
  r.logit_bias = {{42, 100.0f}};
  engine.submit(r, col.callback(0));
  engine.wait_idle();
  CHECK(col.results().at(0).tokens == std::vector<TokenId>(6, 42));
  GenerationRequest bad = request({1}, 1);
  bad.logit_bias = {{300, 1.0f}};
  CHECK_THROWS_AS(engine.submit(bad, col.callback(1)), std::invalid_argument);

  std::string error;
  std::mutex mu;
  engine.submit(request({1, 2, 3}, 100000 / 100), [&](const RequestOutput& o) {
    if (!o.finished) return;
    std::lock_guard lock(mu);
    error = o.error;
  });
  engine.abort_all("drain timed out");
  engine.wait_idle();
  std::lock_guard lock(mu);
  CHECK(error == "drain timed out");
}

TEST_CASE("NaN logits end the request with an error (greedy or sampled); the engine goes on") {
  test::TempDir dir;
  const Model model = nan_model(dir);
  Engine engine(model, cpu_config());
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<TokenId> tokens;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = request({1, 2, static_cast<TokenId>(3 + i)}, 4);
    r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    r.logprobs = i == 3 ? 2 : -1;
    engine.submit(r, [&](const RequestOutput& o) {
      std::lock_guard lock(mu);
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) errors.push_back(o.error);
    });
  }
  engine.wait_idle();
  std::lock_guard lock(mu);
  CHECK(tokens.empty());  // before: NaN reached std::sort's comparator and tokens came out
  REQUIRE(errors.size() == 4);
  for (const auto& e : errors) CHECK(e.find("NaN") != std::string::npos);
  CHECK(engine.stats().scheduler.kv.num_free_blocks == engine.stats().scheduler.kv.num_blocks);
}
