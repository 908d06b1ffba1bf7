#include "engine/grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include <xxhash.h>

#include "kvfleet/tokenizer.h"

namespace kvfleet::grammar {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<TokenId> stop_ids)
    : bytes_(std::move(token_bytes)), stop_ids_(std::move(stop_ids)) {
  std::sort(stop_ids_.begin(), stop_ids_.end());
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
  std::erase_if(stop_ids_, [&](TokenId id) { return id < 0 || static_cast<std::size_t>(id) >= bytes_.size(); });
  for (const TokenId id : stop_ids_) bytes_[id].clear();  // a stop token is never text

  std::vector<TokenId> order;
  for (std::size_t id = 0; id < bytes_.size(); ++id) {
    if (!bytes_[id].empty()) order.push_back(static_cast<TokenId>(id));
  }
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) { return bytes_[a] < bytes_[b]; });

  // Preorder trie: walk the sorted tokens keeping the open path; a node closes when a later token
  // leaves its prefix.
  std::vector<std::int32_t> path;  // node indices of the open path, path[d] at depth d+1
  auto close_to = [&](std::size_t depth) {
    while (path.size() > depth) {
      nodes_[path.back()].subtree_end = static_cast<std::int32_t>(nodes_.size());
      path.pop_back();
    }
  };
  std::vector<std::vector<TokenId>> at_node;
  const std::string* prev = nullptr;
  for (const TokenId id : order) {
    const std::string& b = bytes_[id];
    max_token_bytes_ = std::max(max_token_bytes_, b.size());
    std::size_t lcp = 0;
    if (prev) {
      while (lcp < prev->size() && lcp < b.size() && (*prev)[lcp] == b[lcp]) ++lcp;
    }
    close_to(lcp);
    for (std::size_t d = lcp; d < b.size(); ++d) {
      path.push_back(static_cast<std::int32_t>(nodes_.size()));
      nodes_.push_back(Node{static_cast<std::uint8_t>(b[d]), static_cast<std::uint16_t>(d + 1), 0, 0, 0, -1});
      at_node.emplace_back();
    }
    at_node[path.back()].push_back(id);
    prev = &b;
  }
  close_to(0);
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    nodes_[n].tokens_begin = static_cast<std::int32_t>(node_tokens_.size());
    node_tokens_.insert(node_tokens_.end(), at_node[n].begin(), at_node[n].end());
    nodes_[n].tokens_end = static_cast<std::int32_t>(node_tokens_.size());
  }

  // Large subtrees' byte sets, heights and plainness, children before parents (reverse preorder).
  std::vector<std::uint8_t> utf8_before(nodes_.size());
  {
    std::vector<std::uint8_t> after(max_token_bytes_ + 1, 0);  // after[d]: the state after d bytes of the path
    for (std::size_t n = 0; n < nodes_.size(); ++n) {
      utf8_before[n] = after[nodes_[n].depth - 1];
      after[nodes_[n].depth] = utf8_next(utf8_before[n], nodes_[n].byte);
    }
  }
  std::vector<std::bitset<256>> below(nodes_.size());
  std::vector<std::uint16_t> height(nodes_.size());
  std::vector<char> plain(nodes_.size());
  for (std::size_t n = nodes_.size(); n-- > 0;) {
    below[n].set(nodes_[n].byte);
    height[n] = 1;
    plain[n] = plain_byte(nodes_[n].byte) && utf8_next(utf8_before[n], nodes_[n].byte) != kUtf8Invalid;
    for (std::size_t c = n + 1; c < static_cast<std::size_t>(nodes_[n].subtree_end); c = static_cast<std::size_t>(nodes_[c].subtree_end)) {
      below[n] |= below[c];
      height[n] = std::max<std::uint16_t>(height[n], static_cast<std::uint16_t>(height[c] + 1));
      plain[n] = plain[n] && plain[c];
    }
    nodes_[n].height = height[n];
    nodes_[n].utf8_before = utf8_before[n];
    nodes_[n].plain = plain[n] != 0;
    if (nodes_[n].subtree_end - static_cast<std::int32_t>(n) >= kBulkNodes) {
      nodes_[n].subtree = static_cast<std::int32_t>(subtrees_.size());
      subtrees_.push_back(Subtree{below[n], height[n], utf8_before[n], plain[n] != 0});
    }
  }

  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const std::string& b : bytes_) {
    const std::uint32_t len = static_cast<std::uint32_t>(b.size());
    XXH3_64bits_update(state, &len, sizeof len);
    XXH3_64bits_update(state, b.data(), b.size());
  }
  XXH3_64bits_update(state, stop_ids_.data(), stop_ids_.size() * sizeof(TokenId));
  fingerprint_ = XXH3_64bits_digest(state);
  XXH3_freeState(state);
}

std::uint8_t utf8_next(std::uint8_t state, std::uint8_t b) {
  const bool cont = b >= 0x80 && b <= 0xBF;
  switch (state) {
    case 0:
      if (b < 0x80) return 0;
      if (b >= 0xC2 && b <= 0xDF) return 1;
      if (b == 0xE0) return 4;
      if (b == 0xED) return 5;
      if (b >= 0xE1 && b <= 0xEF) return 2;
      if (b == 0xF0) return 6;
      if (b >= 0xF1 && b <= 0xF3) return 3;
      if (b == 0xF4) return 7;
      return kUtf8Invalid;
    case 1: return cont ? 0 : kUtf8Invalid;
    case 2: return cont ? 1 : kUtf8Invalid;
    case 3: return cont ? 2 : kUtf8Invalid;
    case 4: return b >= 0xA0 && b <= 0xBF ? 1 : kUtf8Invalid;
    case 5: return b >= 0x80 && b <= 0x9F ? 1 : kUtf8Invalid;
    case 6: return b >= 0x90 && b <= 0xBF ? 2 : kUtf8Invalid;
    case 7: return b >= 0x80 && b <= 0x8F ? 2 : kUtf8Invalid;
    default: return kUtf8Invalid;
  }
}

bool Vocabulary::is_stop(TokenId id) const { return std::binary_search(stop_ids_.begin(), stop_ids_.end(), id); }

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const Tokenizer& tokenizer, std::vector<TokenId> stop_ids) {
  std::vector<std::string> bytes(tokenizer.vocab_size());
  for (std::size_t id = 0; id < bytes.size(); ++id) {
    const auto tid = static_cast<TokenId>(id);
    if (!tokenizer.is_special(tid)) bytes[id] = std::string(tokenizer.token_bytes(tid));
  }
  if (stop_ids.empty()) stop_ids = tokenizer.eos_ids();
  return std::make_shared<const Vocabulary>(std::move(bytes), std::move(stop_ids));
}

}  // namespace kvfleet::grammar
