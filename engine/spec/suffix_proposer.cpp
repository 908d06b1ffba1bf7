#include "engine/spec/suffix_proposer.h"

#include <algorithm>

namespace kvfleet::spec {

SuffixProposer::SuffixProposer(const SpeculativeConfig& config)
    : depth_(config.suffix_max_tree_depth),
      max_cached_(static_cast<std::size_t>(std::max(0, config.suffix_max_cached_requests))),
      factor_(config.suffix_max_spec_factor),
      min_prob_(config.suffix_min_token_prob) {}

void SuffixProposer::propose(const ProposeInput& seq, std::int32_t k, std::vector<TokenId>& out) {
  out.clear();
  if (k <= 0 || seq.tokens.empty()) return;
  Live& l = live_.try_emplace(seq.request, depth_).first->second;
  while (l.seen < seq.tokens.size()) l.stream.append(l.tree, seq.tokens[l.seen++]);
  const std::size_t n = std::min(seq.tokens.size(), static_cast<std::size_t>(depth_));
  const std::span<const TokenId> pattern = seq.tokens.last(n);
  SuffixDraft best = l.tree.speculate(pattern, k, factor_, min_prob_);
  if (const auto g = global_.find(std::string(seq.cache_salt)); g != global_.end()) {
    SuffixDraft d = g->second.speculate(pattern, k, factor_, min_prob_);
    if (d.score > best.score) best = std::move(d);
  }
  out = std::move(best.tokens);
  if (static_cast<std::int32_t>(out.size()) > k) out.resize(static_cast<std::size_t>(k));
}

void SuffixProposer::finish(const ProposeInput& seq) {
  live_.erase(seq.request);
  if (max_cached_ == 0) return;
  const auto prompt = static_cast<std::size_t>(std::clamp<std::int64_t>(seq.num_prompt_tokens, 0, static_cast<std::int64_t>(seq.tokens.size())));
  if (prompt == seq.tokens.size()) return;
  Cached c{std::string(seq.cache_salt), std::vector<TokenId>(seq.tokens.begin() + static_cast<std::ptrdiff_t>(prompt), seq.tokens.end())};
  global_.try_emplace(c.salt, depth_).first->second.add(c.outputs);
  cached_.push_back(std::move(c));
  while (cached_.size() > max_cached_) {
    Cached& old = cached_.front();
    const auto g = global_.find(old.salt);
    g->second.remove(old.outputs);
    if (g->second.empty()) global_.erase(g);
    cached_.pop_front();
  }
}

std::size_t SuffixProposer::num_nodes() const {
  std::size_t n = 0;
  for (const auto& [id, l] : live_) n += l.tree.num_nodes();
  for (const auto& [salt, t] : global_) n += t.num_nodes();
  return n;
}

}  // namespace kvfleet::spec
