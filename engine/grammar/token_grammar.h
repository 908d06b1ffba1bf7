// The compiled grammar (kvfleet::TokenGrammar) and its matcher.
//
// Masks (xgrammar's split into context-independent and context-dependent tokens): for each automaton
// state that waits for a byte (a grammar position), one walk of the vocabulary trie from the stack
// [position] sorts every token into accepted (its bytes stay inside the position's rule and the rules it
// calls: allowed whatever stack lies below), rejected, or uncertain (the rule ends inside the token, so
// the rest depends on the stack below). A position's table is computed on its first use and kept
// (xgrammar's adaptive cache, lazily). A matcher's mask is then the union over its parse set's stacks of
// the accepted bits plus those uncertain tokens that its own parser, from the whole stack, accepts.
// A walk skips a large subtree, accepting all of it, when its parse set loops on every byte in it; and
// any subtree (small ones too) when every plain-text string (valid UTF-8, no '"' or '\\' or control
// bytes) as long as the subtree's longest path keeps the set alive (a JSON string's body, bounded or not).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/grammar/automaton.h"
#include "engine/grammar/parse_engine.h"
#include "engine/grammar/vocabulary.h"
#include "kvfleet/token_constraint.h"

namespace kvfleet::grammar {

struct PositionMask {
  std::vector<std::uint32_t> accepted;  // bitmask over the vocabulary
  std::vector<TokenId> uncertain;       // in trie order (sorted by bytes)
};

class CompiledGrammar : public TokenGrammar, public std::enable_shared_from_this<CompiledGrammar> {
 public:
  CompiledGrammar(Automaton automaton, std::shared_ptr<const Vocabulary> vocab);
  ~CompiledGrammar() override;

  std::unique_ptr<TokenMatcher> make_matcher() const override;
  std::size_t vocab_size() const override { return vocab_->size(); }

  const Automaton& automaton() const { return automaton_; }
  const Vocabulary& vocab() const { return *vocab_; }
  const PositionMask& position_mask(std::int32_t state) const;
  std::size_t memory_bytes() const;  // automaton plus the position tables computed so far

 private:
  PositionMask compute_position_mask(std::int32_t state) const;
  std::int32_t plain_horizon(std::uint8_t utf8, std::int32_t set) const;  // under mutex_

  Automaton automaton_;
  std::shared_ptr<const Vocabulary> vocab_;
  mutable std::mutex mutex_;
  mutable ParseEngine walker_;  // under mutex_
  mutable std::vector<std::atomic<const PositionMask*>> masks_;
  mutable std::unordered_map<std::uint64_t, std::int32_t> horizons_;  // under mutex_
  mutable std::atomic<std::size_t> mask_bytes_{0};
};

}  // namespace kvfleet::grammar
