#include "tests/tokenizer/tiktoken_convert.h"

#include <boost/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace kvfleet::test {
namespace json = boost::json;
namespace fs = std::filesystem;
namespace {

std::string base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  int bits = 0;
  unsigned acc = 0;
  for (const char c : in) {
    const int v = value(c);
    if (v < 0) break;  // '=' padding
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

// GPT-2's byte -> printable character mapping, UTF-8 encoded.
std::string byte_level(std::string_view bytes) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[b] = s;
    }
    return t;
  }();
  std::string out;
  for (const char c : bytes) out += table[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace

void write_tiktoken_as_tokenizer_json(const fs::path& ranks_json, const fs::path& dir) {
  std::ifstream in(ranks_json, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + ranks_json.string() + ": run scripts/setup");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const json::value root = json::parse(buffer.str());

  std::unordered_map<std::string, std::int64_t> ranks;
  std::vector<std::string> by_rank;
  std::istringstream fields(std::string(root.at("bpe_ranks").as_string()));
  std::int64_t next = 0;
  for (std::string field; fields >> field;) {
    if (field == "!") {
      fields >> next;
      continue;
    }
    std::string bytes = base64_decode(field);
    if (by_rank.size() <= static_cast<std::size_t>(next)) by_rank.resize(next + 1);
    by_rank[next] = bytes;
    ranks.emplace(std::move(bytes), next++);
  }

  json::object vocab;
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::string, std::string>> merges;
  for (std::size_t r = 0; r < by_rank.size(); ++r) {
    const std::string& token = by_rank[r];
    if (token.empty()) continue;
    vocab[byte_level(token)] = static_cast<std::int64_t>(r);
    for (std::size_t cut = 1; cut < token.size(); ++cut) {
      const auto left = ranks.find(token.substr(0, cut));
      const auto right = ranks.find(token.substr(cut));
      if (left == ranks.end() || right == ranks.end()) continue;
      merges.emplace_back(static_cast<std::int64_t>(r), left->second, right->second, left->first, right->first);
    }
  }
  std::sort(merges.begin(), merges.end());
  json::array merge_array;
  merge_array.reserve(merges.size());
  for (const auto& m : merges) merge_array.push_back(json::array{byte_level(std::get<3>(m)), byte_level(std::get<4>(m))});

  json::array added;
  for (const auto& kv : root.at("special_tokens").as_object()) {
    added.push_back({{"id", kv.value()}, {"content", kv.key()}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  const json::object byte_level_step = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  json::object tokenizer = {
      {"added_tokens", std::move(added)},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array{json::object{{"type", "Split"},
                                  {"pattern", {{"Regex", root.at("pat_str")}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}},
                     byte_level_step}}}},
      {"post_processor", nullptr},
      {"decoder", byte_level_step},
      {"model",
       {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", std::move(vocab)}, {"merges", std::move(merge_array)}}}};
  fs::create_directories(dir);
  std::ofstream out(dir / "tokenizer.json", std::ios::binary);
  out << json::serialize(tokenizer);
  if (!out) throw std::runtime_error("cannot write " + (dir / "tokenizer.json").string());
}

}  // namespace kvfleet::test
