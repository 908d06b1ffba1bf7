// The committed default model (models/kvfleet-default) against what its training script computed in
// PyTorch (eval/reference.json, written by scripts/train-default-model): our tokenizer's ids, our
// perplexity and our greedy continuations must equal the trainer's; our logits must equal the independent
// numpy reference's.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvfleet/engine.h"
#include "kvfleet/model_runner.h"
#include "kvfleet/perplexity.h"
#include "kvfleet/tokenizer.h"
#include "support/temp_dir.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

const std::filesystem::path kModelDir = std::filesystem::path(KVFLEET_SOURCE_DIR) / "models" / "kvfleet-default";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const json::object& reference() {
  static const json::value doc = json::parse(read_file(kModelDir / "eval" / "reference.json"));
  return doc.as_object();
}

std::vector<TokenId> ids_of(const json::value& v) {
  std::vector<TokenId> out;
  for (const auto& x : v.as_array()) out.push_back(x.to_number<TokenId>());
  return out;
}

const Model& model() {
  static const Model m = Model::load(kModelDir);
  return m;
}

std::vector<TokenId> greedy(const std::vector<TokenId>& prompt, std::int32_t n) {
  EngineConfig config;
  config.backend = {"cpu", 2};
  Engine engine(model(), config);
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0.0f;
  r.max_tokens = n;
  r.ignore_eos = true;  // PyTorch's greedy loop does not stop at <|endoftext|> either
  std::vector<TokenId> out;
  engine.submit(r, [&out](const RequestOutput& o) { out.insert(out.end(), o.new_tokens.begin(), o.new_tokens.end()); });
  engine.wait_idle();
  return out;
}

}  // namespace

TEST_CASE("our tokenizer encodes held-out text id for id as the Python trainer does") {
  const Tokenizer tok = Tokenizer::load(kModelDir);
  const auto& ref = reference();
  const std::string heldout = read_file(kModelDir / "eval" / ref.at("heldout_file").as_string().c_str());
  const auto expected = ids_of(ref.at("heldout_ids"));
  REQUIRE(expected.size() > 500);
  CHECK(tok.encode(heldout, false) == expected);
  CHECK(tok.decode(expected) == heldout);
  for (const auto& s : ref.at("tokenizer_samples").as_array()) {
    const std::string text(s.at("text").as_string());
    CAPTURE(text);
    CHECK(tok.encode(text, false) == ids_of(s.at("ids")));
  }
  // The chat markers are single special tokens, and the chat stops on <|im_end|> and <|endoftext|>.
  const auto im_end = tok.token_to_id("<|im_end|>");
  REQUIRE(im_end.has_value());
  CHECK(tok.encode("<|im_start|>user\nHi<|im_end|>", false).back() == *im_end);
  const auto eos = tok.eos_ids();
  CHECK(std::find(eos.begin(), eos.end(), *im_end) != eos.end());
  CHECK(std::find(eos.begin(), eos.end(), *tok.token_to_id("<|endoftext|>")) != eos.end());
}

TEST_CASE("kvfleet's perplexity on held-out text equals PyTorch's") {
  const auto& ref = reference();
  const auto ids = ids_of(ref.at("heldout_ids"));
  auto backend = make_cpu_backend(2);
  const PerplexityResult r = window_perplexity(model(), *backend, ids, ref.at("context").to_number<std::int64_t>());
  CHECK(r.tokens_scored == ref.at("tokens_scored").to_number<std::int64_t>());
  const double want = ref.at("perplexity").to_number<double>();
  MESSAGE("perplexity: kvfleet " << r.perplexity() << ", PyTorch " << want);
  CHECK(std::abs(r.perplexity() - want) / want < 1e-4);
  CHECK(std::abs(r.mean_nll() - ref.at("mean_nll").to_number<double>()) < 1e-4);
}

TEST_CASE("kvfleet's greedy continuations equal PyTorch's") {
  const Tokenizer tok = Tokenizer::load(kModelDir);
  for (const auto& g : reference().at("greedy").as_array()) {
    const std::string prompt(g.at("prompt").as_string());
    CAPTURE(prompt);
    const auto prompt_ids = ids_of(g.at("prompt_ids"));
    CHECK(tok.encode(prompt, false) == prompt_ids);
    const auto expected = ids_of(g.at("continuation_ids"));
    REQUIRE(expected.size() >= 24);
    const auto got = greedy(prompt_ids, static_cast<std::int32_t>(expected.size()));
    CHECK(got == expected);
    CHECK(tok.decode(got) == std::string(g.at("continuation").as_string()));
  }
}

TEST_CASE("kvfleet's logits on the default model equal the numpy reference's") {
  auto ids = ids_of(reference().at("heldout_ids"));
  ids.resize(48);
  std::string list;
  for (auto id : ids) {
    if (!list.empty()) list += ',';
    list += std::to_string(id);
  }
  const auto r = test::run_command("/usr/bin/python3 " + std::string(KVFLEET_SOURCE_DIR) +
                                   "/tests/reference/llama_ref.py --model " + kModelDir.string() + " --ids " + list);
  REQUIRE_MESSAGE(r.status == 0, "the numpy reference failed (python3-numpy missing?)");
  std::vector<double> ref;
  const json::value doc = json::parse(r.out);  // kept alive: the loop below reads into it
  for (const auto& row : doc.at("logits").as_array().at(0).as_array())
    for (const auto& v : row.as_array()) ref.push_back(v.to_number<double>());
  auto backend = make_cpu_backend(2);
  const auto ours = all_position_logits(model(), *backend, ids);
  REQUIRE(ours.size() == ref.size());
  double max_diff = 0.0, max_ref = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(ours[i] - ref[i]));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  REQUIRE(max_ref > 1.0);
  CHECK(max_diff / max_ref < 1e-5);
}
