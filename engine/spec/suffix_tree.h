// A depth-bounded suffix tree with counts: every substring of at most `max_depth` tokens of the sequences
// added to it, one node per distinct substring, each node counting the substring's occurrences. It answers
// suffix decoding's question: given the last tokens of a sequence, which tokens followed them most often?
//
//   add(tokens)            all substrings of `tokens` of length <= max_depth counted in (O(len x depth))
//   Stream                 the same, one token at a time (a growing sequence: the prompt, then its outputs)
//   remove(tokens)         exactly undoes add(tokens) (the caller keeps the tokens); nodes at count 0 are freed
//   speculate(pattern)     for each suffix of the pattern (longest first) that occurs with a continuation, the
//                          most frequent path after it: token after token the child with the highest count (ties:
//                          the smaller id), its probability the running product of child / parent counts, until
//                          that falls under min_prob or max_tokens = min(limit, floor(factor x match length)).
//                          The draft with the highest score (sum of its tokens' probabilities) wins; ties: the
//                          longer match. Deterministic: a function of the tree's contents.
//
// Memory: at most len x max_depth nodes per added sequence, less where substrings repeat; num_nodes() counts
// the live ones. Not thread-safe (the engine thread owns it).
#pragma once

#include <boost/unordered/unordered_flat_map.hpp>
#include <cstdint>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::spec {

struct SuffixDraft {
  std::vector<TokenId> tokens;
  double score = 0.0;           // sum of the tokens' estimated probabilities
  std::int32_t match_len = 0;   // tokens of the pattern matched
};

class SuffixTree {
 public:
  explicit SuffixTree(std::int32_t max_depth);

  // Adds a sequence one token at a time: the nodes of the suffixes that end at its last token.
  class Stream {
   public:
    void append(SuffixTree& tree, TokenId token);

   private:
    std::vector<std::int32_t> active_;  // nodes of depth < max_depth ending at the last token
    std::vector<std::int32_t> next_;
  };

  void add(std::span<const TokenId> tokens);
  void remove(std::span<const TokenId> tokens);

  // The best draft for what follows `pattern` (only its last max_depth - 1 tokens matter).
  SuffixDraft speculate(std::span<const TokenId> pattern, std::int32_t max_tokens, double max_spec_factor,
                        double min_token_prob) const;

  std::int32_t max_depth() const { return max_depth_; }
  std::size_t num_nodes() const { return nodes_.size() - free_.size() - 1; }  // the root not counted
  bool empty() const { return num_nodes() == 0; }

 private:
  struct Node {
    TokenId token = 0;
    std::int32_t parent = -1;
    std::int32_t count = 0;
    std::int32_t depth = 0;
    std::int32_t first_child = -1;
    std::int32_t next_sibling = -1;
  };
  static std::uint64_t key(std::int32_t node, TokenId token) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(node)) << 32) | static_cast<std::uint32_t>(token);
  }
  std::int32_t child(std::int32_t node, TokenId token) const;
  // The child, created at count 0 when missing; then counted once more.
  std::int32_t count_child(std::int32_t node, TokenId token);
  void free_node(std::int32_t node);
  void draft_from(std::int32_t node, std::int32_t max_tokens, double min_token_prob, SuffixDraft& out) const;

  std::int32_t max_depth_;
  std::vector<Node> nodes_;  // nodes_[0]: the root (the empty substring)
  std::vector<std::int32_t> free_;
  boost::unordered_flat_map<std::uint64_t, std::int32_t> edges_;  // (parent, token) -> child
};

}  // namespace kvfleet::spec
