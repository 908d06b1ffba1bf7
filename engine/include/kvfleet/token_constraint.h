// Constrained decoding (structured outputs, forced tool calls): what the engine needs from a grammar.
//
// A TokenGrammar is compiled once per (grammar, vocabulary), is immutable and shared between requests
// (and threads); each constrained sequence owns a TokenMatcher made from it. Per generated token the
// engine asks the matcher for the set of allowed next tokens (a bitmask over the vocabulary), masks the
// logits (disallowed -> -inf) before penalties' effects are sampled, top-k/top-p/min-p and the draw, then
// tells the matcher which token was chosen. The end of the sequence is part of the grammar: the vocabulary's
// stop tokens are allowed exactly where the grammar may end, and once a stop token is accepted (or the
// grammar cannot continue at all) the matcher is terminated and the sequence finishes with reason `stop`.
//
// Bitmask layout (xgrammar's and vLLM's): bit (id % 32) of word (id / 32), set = allowed; a mask has
// bitmask_words(vocab_size) words. Ids at or past the vocabulary's size are never allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet {

constexpr std::size_t bitmask_words(std::size_t vocab_size) { return (vocab_size + 31) / 32; }
inline bool bitmask_allows(std::span<const std::uint32_t> mask, TokenId id) {
  const auto i = static_cast<std::size_t>(id);
  return i / 32 < mask.size() && ((mask[i / 32] >> (i % 32)) & 1u);
}

class TokenMatcher {
 public:
  virtual ~TokenMatcher() = default;
  // Writes every word of `mask` (bitmask_words(vocab_size) of them): exactly the tokens that may come next.
  virtual void fill_next_token_mask(std::span<std::uint32_t> mask) = 0;
  // Advances past one generated token. False (and no change) if the token was not allowed.
  virtual bool accept_token(TokenId id) = 0;
  // Undoes the last `n` accepted tokens (speculative decoding's rejected drafts); n <= tokens accepted.
  virtual void rollback(std::size_t n) = 0;
  // A stop token was accepted, or nothing can follow: the sequence must end.
  virtual bool is_terminated() const = 0;
};

class TokenGrammar {
 public:
  virtual ~TokenGrammar() = default;
  virtual std::unique_ptr<TokenMatcher> make_matcher() const = 0;
  virtual std::size_t vocab_size() const = 0;
};

}  // namespace kvfleet
