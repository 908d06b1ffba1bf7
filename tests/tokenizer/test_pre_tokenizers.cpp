// Pre-tokenizer and added-token behaviours the reference models do not exercise, tested on the
// internal pieces directly.
#include <doctest/doctest.h>

#include "engine/core/tokenizer/parts.h"

#include <boost/json.hpp>

namespace kvfleet::test {
namespace json = boost::json;

namespace {

std::vector<std::string> pre_tokenize(const char* config_json, const std::string& text, bool first = true) {
  const auto pre = tok::make_pre_tokenizer(json::parse(config_json));
  tok::Pieces pieces{text, {{0, text.size()}}};
  pre->apply(pieces, first);
  std::vector<std::string> out;
  for (const auto& s : pieces.spans) out.push_back(pieces.text.substr(s.begin, s.end - s.begin));
  return out;
}

using Strings = std::vector<std::string>;
const std::string kText = "the-final--countdown";

}  // namespace

TEST_CASE("Split delimiter behaviours (the Hugging Face documentation's example)") {
  auto split = [](const char* behavior) {
    const std::string config = std::string(R"({"type":"Split","pattern":{"String":"-"},"behavior":")") +
                               behavior + R"(","invert":false})";
    return pre_tokenize(config.c_str(), kText);
  };
  CHECK(split("Removed") == Strings{"the", "final", "countdown"});
  CHECK(split("Isolated") == Strings{"the", "-", "final", "-", "-", "countdown"});
  CHECK(split("MergedWithPrevious") == Strings{"the-", "final-", "-", "countdown"});
  CHECK(split("MergedWithNext") == Strings{"the", "-final", "-", "-countdown"});
  CHECK(split("Contiguous") == Strings{"the", "-", "final", "--", "countdown"});
}

TEST_CASE("Split with a regex, inverted") {
  CHECK(pre_tokenize(R"({"type":"Split","pattern":{"Regex":"\\p{L}+"},"behavior":"Removed","invert":true})",
                     "héllo, wörld!") == Strings{"héllo", "wörld"});
}

TEST_CASE("ByteLevel: prefix space and the GPT-2 split") {
  CHECK(pre_tokenize(R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":true})", "Hello  world's") ==
        Strings{" Hello", " ", " world", "'s"});
}

TEST_CASE("Metaspace: replacement, prepend_scheme, split") {
  const char* first = R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true})";
  CHECK(pre_tokenize(first, "Hey friend", true) == Strings{"▁Hey", "▁friend"});
  CHECK(pre_tokenize(first, "Hey friend", false) == Strings{"Hey", "▁friend"});
  CHECK(pre_tokenize(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":false})",
                     "a b") == Strings{"a▁b"});
}

TEST_CASE("Digits and Sequence") {
  CHECK(pre_tokenize(R"({"type":"Digits","individual_digits":true})", "ab123c") ==
        Strings{"ab", "1", "2", "3", "c"});
  CHECK(pre_tokenize(R"({"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":false},
                        {"type":"Split","pattern":{"String":" "},"behavior":"Removed","invert":false}]})",
                     "ab 123c") == Strings{"ab", "123", "c"});
}

TEST_CASE("added tokens: lstrip / rstrip eat neighbouring whitespace, single_word needs boundaries") {
  tok::AddedTokenMatcher matcher({{"<x>", 5, true, false, true, true, false},
                                  {"<w>", 7, true, false, false, false, true},
                                  {"<xx>", 8, true, false, false, false, false}});
  auto sections = [&](std::string_view text) {
    std::vector<tok::AddedTokenMatcher::Section> out;
    matcher.split(text, out);
    Strings s;
    for (const auto& sec : out) {
      std::string piece(sec.token >= 0 ? "#" : "");
      piece.append(text.substr(sec.begin, sec.end - sec.begin));
      s.push_back(std::move(piece));
    }
    return s;
  };
  CHECK(sections("ab \t<x>  c") == Strings{"ab", "#<x>", "c"});
  CHECK(sections("a<w>b") == Strings{"a<w>b"});
  CHECK(sections("a <w> b") == Strings{"a ", "#<w>", " b"});
  CHECK(sections("<xx><x>") == Strings{"#<xx>", "#<x>"});  // longest match first
  CHECK(sections("") == Strings{});
}

TEST_CASE("normalizers: NFC, Prepend, Replace, Sequence") {
  std::string s = "cafe\xCC\x81";  // e + combining acute
  tok::make_normalizer(json::parse(R"({"type":"NFC"})"))->normalize(s);
  CHECK(s == "caf\xC3\xA9");
  s = "a b";
  tok::make_normalizer(json::parse(R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},
                                      {"type":"Replace","pattern":{"String":" "},"content":"▁"}]})"))
      ->normalize(s);
  CHECK(s == "▁a▁b");
  CHECK_THROWS_AS(tok::make_normalizer(json::parse(R"({"type":"Precompiled"})")), std::runtime_error);
}

}  // namespace kvfleet::test
