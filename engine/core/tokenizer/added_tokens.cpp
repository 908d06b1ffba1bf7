// Added tokens (<|im_start|>, <s>, ...) are found in the raw text before anything else runs, so that
// normalizers and pre-tokenizers never see (and break) them. Matching is leftmost-longest over a byte
// trie, as in transformers.js's DictionarySplitter and HF's Aho-Corasick matcher.
#include <utf8proc.h>

#include "engine/core/tokenizer/parts.h"

namespace kvfleet::tok {
namespace {

bool is_word_char(char32_t cp) {
  if (cp == '_') return true;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// Start of the character that ends right before `pos`.
std::size_t previous_char(std::string_view s, std::size_t pos) {
  std::size_t i = pos - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

void trim_back(std::string_view text, AddedTokenMatcher::Section& s) {
  while (s.end > s.begin) {
    const std::size_t start = previous_char(text, s.end);
    std::size_t len;
    if (!is_unicode_space(utf8_decode(text, start, len))) break;
    s.end = start;
  }
}

void trim_front(std::string_view text, AddedTokenMatcher::Section& s) {
  while (s.begin < s.end) {
    std::size_t len;
    if (!is_unicode_space(utf8_decode(text, s.begin, len))) break;
    s.begin += len;
  }
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  node_token_.push_back(-1);
  for (int t = 0; t < static_cast<int>(tokens_.size()); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[static_cast<unsigned char>(content[0])] = true;
    int node = 0;
    for (const char c : content) {
      const std::uint32_t key = (std::uint32_t(node) << 8) | static_cast<unsigned char>(c);
      auto [it, inserted] = edges_.try_emplace(key, static_cast<int>(node_token_.size()));
      if (inserted) node_token_.push_back(-1);
      node = it->second;
    }
    if (node_token_[node] < 0) node_token_[node] = t;  // first definition of a duplicate wins
  }
}

int AddedTokenMatcher::longest_match(std::string_view text, std::size_t pos) const {
  int node = 0;
  int best = -1;
  for (std::size_t i = pos; i < text.size(); ++i) {
    const auto it = edges_.find((std::uint32_t(node) << 8) | static_cast<unsigned char>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (node_token_[node] >= 0) best = node_token_[node];
  }
  return best;
}

bool AddedTokenMatcher::word_boundary_ok(std::string_view text, std::size_t begin,
                                         std::size_t end) const {
  std::size_t len;
  if (begin > 0 && is_word_char(utf8_decode(text, previous_char(text, begin), len))) return false;
  return end >= text.size() || !is_word_char(utf8_decode(text, end, len));
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Section>& out,
                              std::span<const std::pair<std::size_t, std::size_t>> plain) const {
  out.clear();
  // Whether [begin, end) overlaps a plain range; positions only grow, so the scan index only moves on.
  std::size_t next_plain = 0;
  auto in_plain = [&](std::size_t begin, std::size_t end) {
    while (next_plain < plain.size() && plain[next_plain].second <= begin) ++next_plain;
    return next_plain < plain.size() && plain[next_plain].first < end;
  };
  std::size_t start = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const int t = longest_match(text, pos);
    const std::size_t end = t >= 0 ? pos + tokens_[t].content.size() : pos;
    if (t < 0 || (tokens_[t].single_word && !word_boundary_ok(text, pos, end)) ||
        (tokens_[t].special && in_plain(pos, end))) {
      ++pos;
      continue;
    }
    if (pos > start) out.push_back({start, pos, -1});
    out.push_back({pos, end, t});
    pos = start = end;
  }
  if (start < text.size()) out.push_back({start, text.size(), -1});

  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i].token < 0) continue;
    const AddedToken& token = tokens_[out[i].token];
    if (token.lstrip && i > 0 && out[i - 1].token < 0) trim_back(text, out[i - 1]);
    if (token.rstrip && i + 1 < out.size() && out[i + 1].token < 0) trim_front(text, out[i + 1]);
  }
}

}  // namespace kvfleet::tok
