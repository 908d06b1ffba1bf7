// Suffix decoding (vLLM's "suffix" method, after Arctic Inference's SuffixDecoding): drafts from suffix trees
// (engine/spec/suffix_tree.h) over
//   - the request's own prompt and outputs so far (built at its first proposal, extended token by token), and
//   - the outputs of earlier requests of this replica with the same cache_salt (one tree per salt: a tenant's
//     outputs never draft another tenant's tokens, as its KV blocks are never shared).
// Each proposal matches the sequence's last tokens in both trees and keeps the higher-scoring draft.
//
// Bounds: earlier outputs are kept for at most suffix_decoding_max_cached_requests requests replica-wide,
// oldest finished out first (its counts removed from its salt's tree, the tree dropped once empty); a live
// request's tree is dropped when it finishes. Each tree holds at most max_tree_depth nodes per token.
#pragma once

#include <deque>
#include <string>
#include <unordered_map>

#include "engine/spec/proposer.h"
#include "engine/spec/suffix_tree.h"

namespace kvfleet::spec {

class SuffixProposer final : public Proposer {
 public:
  explicit SuffixProposer(const SpeculativeConfig& config);
  void propose(const ProposeInput& seq, std::int32_t k, std::vector<TokenId>& out) override;
  void finish(const ProposeInput& seq) override;

  // For tests and metrics: requests whose outputs are cached, live requests' trees, nodes of all trees.
  std::size_t num_cached_requests() const { return cached_.size(); }
  std::size_t num_live() const { return live_.size(); }
  std::size_t num_salts() const { return global_.size(); }
  std::size_t num_nodes() const;

 private:
  struct Live {
    explicit Live(std::int32_t depth) : tree(depth) {}
    SuffixTree tree;
    SuffixTree::Stream stream;
    std::size_t seen = 0;  // tokens added to `tree`
  };
  struct Cached {
    std::string salt;
    std::vector<TokenId> outputs;
  };

  std::int32_t depth_;
  std::size_t max_cached_;
  double factor_, min_prob_;
  std::unordered_map<std::uint64_t, Live> live_;
  std::unordered_map<std::string, SuffixTree> global_;  // by cache salt
  std::deque<Cached> cached_;                           // oldest first
};

}  // namespace kvfleet::spec
