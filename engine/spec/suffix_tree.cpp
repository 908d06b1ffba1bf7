#include "engine/spec/suffix_tree.h"

#include <algorithm>
#include <cmath>

namespace kvfleet::spec {

SuffixTree::SuffixTree(std::int32_t max_depth) : max_depth_(std::max(1, max_depth)) { nodes_.emplace_back(); }

std::int32_t SuffixTree::child(std::int32_t node, TokenId token) const {
  const auto it = edges_.find(key(node, token));
  return it == edges_.end() ? -1 : it->second;
}

std::int32_t SuffixTree::count_child(std::int32_t node, TokenId token) {
  auto [it, inserted] = edges_.try_emplace(key(node, token), -1);
  if (inserted) {
    std::int32_t c;
    if (!free_.empty()) {
      c = free_.back();
      free_.pop_back();
    } else {
      c = static_cast<std::int32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    Node& n = nodes_[static_cast<std::size_t>(c)];
    Node& p = nodes_[static_cast<std::size_t>(node)];
    n = Node{token, node, 0, p.depth + 1, -1, p.first_child};
    p.first_child = c;
    it->second = c;
  }
  nodes_[static_cast<std::size_t>(it->second)].count += 1;
  return it->second;
}

void SuffixTree::free_node(std::int32_t node) {
  Node& n = nodes_[static_cast<std::size_t>(node)];
  edges_.erase(key(n.parent, n.token));
  // Unlink from the parent's children.
  std::int32_t* link = &nodes_[static_cast<std::size_t>(n.parent)].first_child;
  while (*link != node) link = &nodes_[static_cast<std::size_t>(*link)].next_sibling;
  *link = n.next_sibling;
  n = Node{};
  free_.push_back(node);
}

void SuffixTree::Stream::append(SuffixTree& tree, TokenId token) {
  next_.clear();
  active_.push_back(0);  // the suffix that starts at this token
  for (const std::int32_t node : active_) {
    const std::int32_t c = tree.count_child(node, token);
    if (tree.nodes_[static_cast<std::size_t>(c)].depth < tree.max_depth_) next_.push_back(c);
  }
  active_.swap(next_);
}

void SuffixTree::add(std::span<const TokenId> tokens) {
  Stream s;
  for (const TokenId t : tokens) s.append(*this, t);
}

void SuffixTree::remove(std::span<const TokenId> tokens) {
  std::vector<std::int32_t> path;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    path.clear();
    std::int32_t node = 0;
    const std::size_t end = std::min(tokens.size(), i + static_cast<std::size_t>(max_depth_));
    for (std::size_t j = i; j < end; ++j) {
      node = child(node, tokens[j]);
      if (node < 0) break;  // not added: nothing to undo below
      path.push_back(node);
    }
    // Deepest first: a node's children never outnumber it, so they are gone before it is freed.
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      if (--nodes_[static_cast<std::size_t>(*it)].count <= 0) free_node(*it);
    }
  }
}

void SuffixTree::draft_from(std::int32_t node, std::int32_t max_tokens, double min_token_prob, SuffixDraft& out) const {
  double prob = 1.0;
  while (static_cast<std::int32_t>(out.tokens.size()) < max_tokens) {
    const Node& n = nodes_[static_cast<std::size_t>(node)];
    std::int32_t best = -1;
    for (std::int32_t c = n.first_child; c >= 0; c = nodes_[static_cast<std::size_t>(c)].next_sibling) {
      const Node& cn = nodes_[static_cast<std::size_t>(c)];
      if (best < 0) {
        best = c;
        continue;
      }
      const Node& bn = nodes_[static_cast<std::size_t>(best)];
      if (cn.count > bn.count || (cn.count == bn.count && cn.token < bn.token)) best = c;
    }
    if (best < 0) return;
    const Node& b = nodes_[static_cast<std::size_t>(best)];
    prob *= static_cast<double>(b.count) / std::max(1, n.count);
    if (prob < min_token_prob) return;
    out.tokens.push_back(b.token);
    out.score += prob;
    node = best;
  }
}

SuffixDraft SuffixTree::speculate(std::span<const TokenId> pattern, std::int32_t max_tokens, double max_spec_factor,
                                  double min_token_prob) const {
  SuffixDraft best;
  if (max_tokens <= 0 || pattern.empty()) return best;
  // A matched context of m tokens leaves max_depth - m for the drafts: m < max_depth.
  const std::size_t longest = std::min(pattern.size(), static_cast<std::size_t>(max_depth_ - 1));
  SuffixDraft d;
  for (std::size_t m = longest; m >= 1; --m) {
    std::int32_t node = 0;
    for (std::size_t j = pattern.size() - m; j < pattern.size() && node >= 0; ++j) node = child(node, pattern[j]);
    if (node < 0 || nodes_[static_cast<std::size_t>(node)].first_child < 0) continue;
    const auto cap = static_cast<std::int32_t>(std::floor(max_spec_factor * static_cast<double>(m) + 1e-9));
    d.tokens.clear();
    d.score = 0.0;
    d.match_len = static_cast<std::int32_t>(m);
    draft_from(node, std::min(max_tokens, cap), min_token_prob, d);
    if (d.score > best.score) best = d;
  }
  return best;
}

}  // namespace kvfleet::spec
