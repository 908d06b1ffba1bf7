// The streaming decoder: complete UTF-8 only, characters split over tokens come out whole, and the
// pushes concatenated equal decode().
#include <doctest/doctest.h>

#include "engine/core/tokenizer/parts.h"
#include "tests/tokenizer/fixtures.h"

namespace kvfleet::test {
using Ids = std::vector<TokenId>;

namespace {

std::vector<std::string> stream(const Tokenizer& tk, const Ids& ids, bool skip_special = false) {
  StreamDecoder decoder(tk, skip_special);
  std::vector<std::string> chunks;
  for (const TokenId id : ids) chunks.push_back(decoder.push(id));
  chunks.push_back(decoder.flush());
  return chunks;
}

std::string join(const std::vector<std::string>& chunks) {
  std::string out;
  for (const auto& c : chunks) out += c;
  return out;
}

}  // namespace

TEST_CASE("byte-level: an emoji spread over several tokens comes out whole, once") {
  const Tokenizer& gpt2 = shared_tokenizer("gpt2");
  const Ids ids = gpt2.encode("\xF0\x9F\x98\x80");  // U+1F600, 4 bytes
  REQUIRE(ids.size() >= 2);
  const auto chunks = stream(gpt2, ids);
  for (std::size_t i = 0; i + 2 < chunks.size(); ++i) CHECK(chunks[i].empty());
  CHECK(chunks[chunks.size() - 2] == "\xF0\x9F\x98\x80");
  CHECK(chunks.back().empty());
}

TEST_CASE("byte fallback: <0xNN> tokens assemble into one character") {
  const Tokenizer& llama2 = shared_tokenizer("llama2");
  const TokenId f0 = *llama2.token_to_id("<0xF0>");
  const TokenId x9f = *llama2.token_to_id("<0x9F>");
  const TokenId x98 = *llama2.token_to_id("<0x98>");
  const TokenId x80 = *llama2.token_to_id("<0x80>");
  CHECK(stream(llama2, Ids{f0, x9f, x98, x80}) == std::vector<std::string>{"", "", "", "\xF0\x9F\x98\x80", ""});
  // Cut short: flush turns the incomplete character into U+FFFD; a stray byte right away.
  CHECK(stream(llama2, Ids{f0, x9f}) == std::vector<std::string>{"", "", "\xEF\xBF\xBD"});
  CHECK(stream(llama2, Ids{x80}) == std::vector<std::string>{"\xEF\xBF\xBD", ""});
  CHECK(llama2.decode(Ids{f0, x9f, x98, x80}) == "\xF0\x9F\x98\x80");
}

TEST_CASE("Metaspace-style leading space is stripped once, at the start of the stream") {
  const Tokenizer& llama2 = shared_tokenizer("llama2");
  const Ids ids = llama2.encode("Hello world", false);
  CHECK(join(stream(llama2, ids)) == "Hello world");
  CHECK(llama2.decode(ids) == "Hello world");
  const Ids with_bos = llama2.encode("Hello world", true);
  CHECK(join(stream(llama2, with_bos, true)) == "Hello world");
  CHECK(join(stream(llama2, with_bos, false)) == llama2.decode(with_bos));
}

TEST_CASE("streamed chunks are valid UTF-8 and concatenate to decode(), over the whole corpus") {
  for (const std::string model : {"gpt2", "qwen3", "llama3_1", "llama2", "gemma3"}) {
    CAPTURE(model);
    const Tokenizer& tk = shared_tokenizer(model);
    std::size_t multi_token_chars = 0;
    for (const auto& text : reference(model).texts) {
      const Ids ids = tk.encode(text);
      const auto chunks = stream(tk, ids);
      for (const auto& c : chunks) REQUIRE(tok::utf8_find_invalid(c) == tok::npos);
      REQUIRE(join(chunks) == tk.decode(ids));
      for (std::size_t i = 0; i + 1 < ids.size(); ++i) multi_token_chars += chunks[i].empty();
    }
    CHECK(multi_token_chars > 0);  // the corpus does split characters across tokens
  }
}

}  // namespace kvfleet::test
