// The section cache (engine/core/tokenizer/section_cache.h) must be invisible: a long section that
// recurs (a chat prompt's system message) gives the same ids from the cache as computed afresh, and
// a section at the start of the input is never confused with the same text after a special token
// (Metaspace's prepend_scheme "first" tokenizes those differently).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "fixtures.h"

namespace kvfleet::test {

namespace {

std::string long_section() {
  std::string s;
  while (s.size() < 700)
    s += "You are a helpful assistant.  Répondez brièvement; 東京は晴れ 🌤️ 12345 tokens\tand\n  spaces. ";
  return s;
}

void check_cache_is_exact(const std::string& model) {
  INFO("model " << model);
  const std::string section = long_section();
  const std::string special = *shared_tokenizer(model).id_to_token(shared_tokenizer(model).eos_ids().at(0));
  const std::string after_special = special + section;
  // Ground truth from tokenizers that saw each text once (nothing cached on a first sighting).
  const std::vector<TokenId> first_truth = Tokenizer::load(model_path(model)).encode(section, false);
  const std::vector<TokenId> later_truth = Tokenizer::load(model_path(model)).encode(after_special, false);
  REQUIRE(later_truth.size() > 1);

  const Tokenizer tokenizer = Tokenizer::load(model_path(model));
  for (int round = 0; round < 3; ++round) {  // miss, miss (stored), hit
    CHECK(tokenizer.encode(section, false) == first_truth);
    CHECK(tokenizer.encode(after_special, false) == later_truth);
  }
  // Within one input: the same section three times between special tokens.
  const std::string chat = special + section + special + section + special + section;
  std::vector<TokenId> expected;
  for (int i = 0; i < 3; ++i) expected.insert(expected.end(), later_truth.begin(), later_truth.end());
  CHECK(Tokenizer::load(model_path(model)).encode(chat, false) == expected);
  CHECK(tokenizer.encode(chat, false) == expected);
}

}  // namespace

TEST_CASE("section cache: cached ids equal computed ids, first sections kept apart") {
  for (const std::string model : {"qwen3", "llama3_1", "llama2", "gemma3"}) check_cache_is_exact(model);
}

// None of the reference tokenizers depends on the flag (their prefix space comes from a normalizer),
// so a small Metaspace "first" tokenizer shows that the cache keeps the two cases apart.
TEST_CASE("section cache: Metaspace prepend_scheme first, same text at the start and after a special token") {
  const auto dir = std::filesystem::temp_directory_path() / "kvfleet-section-cache-test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "tokenizer.json");
    out << R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"\u2581":2,"\u2581a":3,"<s>":4},"merges":["\u2581 a"]},)"
        << R"("added_tokens":[{"id":4,"content":"<s>","special":true}],)"
        << R"("pre_tokenizer":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"first","split":true}})";
  }
  const Tokenizer tokenizer = Tokenizer::load(dir / "tokenizer.json");
  std::string section;
  for (int i = 0; i < 150; ++i) section += "ab ";  // 450 bytes: long enough to be cached
  const std::vector<TokenId> at_start = Tokenizer::load(dir / "tokenizer.json").encode(section, false);
  const std::vector<TokenId> after = Tokenizer::load(dir / "tokenizer.json").encode("<s>" + section, false);
  REQUIRE(at_start.at(0) == 3);  // "▁a": the prefix space only at the start of the input
  REQUIRE(after.at(1) == 0);     // "a"
  for (int round = 0; round < 3; ++round) {
    CHECK(tokenizer.encode(section, false) == at_start);
    CHECK(tokenizer.encode("<s>" + section, false) == after);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace kvfleet::test
