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

  // Subtree byte sets, children before parents (a reverse preorder pass).
  std::vector<std::bitset<256>> below(nodes_.size());
  for (std::size_t n = nodes_.size(); n-- > 0;) {
    below[n].set(nodes_[n].byte);
    for (std::size_t c = n + 1; c < static_cast<std::size_t>(nodes_[n].subtree_end); c = static_cast<std::size_t>(nodes_[c].subtree_end)) {
      below[n] |= below[c];
    }
    if (nodes_[n].subtree_end - static_cast<std::int32_t>(n) >= kBulkNodes) {
      nodes_[n].subtree_bytes = static_cast<std::int32_t>(subtree_bytes_.size());
      subtree_bytes_.push_back(below[n]);
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
