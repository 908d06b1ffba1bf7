// A TokenGrammar for tests: the output must be one of a fixed set of token sequences, followed by one of the
// stop ids (when there are any; without stop ids the matcher terminates as soon as no allowed sequence goes
// on). Stands in for the grammar engine wherever the engine's and the API's side of constrained decoding is
// tested. `fail_after`: fill_next_token_mask throws once that many tokens were accepted (a broken grammar).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kvfleet/token_constraint.h"

namespace kvfleet::test {

class SequenceGrammar final : public TokenGrammar {
 public:
  SequenceGrammar(std::vector<std::vector<TokenId>> sequences, std::vector<TokenId> stop_ids, std::size_t vocab,
                  int fail_after = -1)
      : sequences_(std::move(sequences)), stop_ids_(std::move(stop_ids)), vocab_(vocab), fail_after_(fail_after) {}

  std::unique_ptr<TokenMatcher> make_matcher() const override { return std::make_unique<Matcher>(*this); }
  std::size_t vocab_size() const override { return vocab_; }

  // Every allowed token after `prefix`, and whether a sequence ends exactly there.
  std::vector<TokenId> next(const std::vector<TokenId>& prefix, bool& complete) const {
    std::vector<TokenId> out;
    complete = false;
    for (const auto& s : sequences_) {
      if (s.size() < prefix.size() || !std::equal(prefix.begin(), prefix.end(), s.begin())) continue;
      if (s.size() == prefix.size()) complete = true;
      else out.push_back(s[prefix.size()]);
    }
    if (complete) out.insert(out.end(), stop_ids_.begin(), stop_ids_.end());
    return out;
  }
  bool is_stop(TokenId t) const { return std::find(stop_ids_.begin(), stop_ids_.end(), t) != stop_ids_.end(); }
  bool has_stops() const { return !stop_ids_.empty(); }

 private:
  class Matcher final : public TokenMatcher {
   public:
    explicit Matcher(const SequenceGrammar& g) : g_(g) {}
    void fill_next_token_mask(std::span<std::uint32_t> mask) override {
      if (g_.fail_after_ >= 0 && static_cast<int>(accepted_.size()) >= g_.fail_after_)
        throw std::runtime_error("test grammar broke");
      std::fill(mask.begin(), mask.end(), 0u);
      if (terminated_) return;
      bool complete = false;
      for (TokenId t : g_.next(accepted_, complete)) mask[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
    }
    bool accept_token(TokenId id) override {
      if (terminated_) return false;
      bool complete = false;
      const auto allowed = g_.next(accepted_, complete);
      if (std::find(allowed.begin(), allowed.end(), id) == allowed.end()) return false;
      accepted_.push_back(id);
      if (complete && g_.is_stop(id)) {
        terminated_ = true;
      } else if (!g_.has_stops()) {
        bool done = false;
        terminated_ = g_.next(accepted_, done).empty();
      }
      return true;
    }
    void rollback(std::size_t n) override {
      accepted_.resize(accepted_.size() - n);
      terminated_ = false;
    }
    bool is_terminated() const override { return terminated_; }

   private:
    const SequenceGrammar& g_;
    std::vector<TokenId> accepted_;
    bool terminated_ = false;
  };

  std::vector<std::vector<TokenId>> sequences_;
  std::vector<TokenId> stop_ids_;
  std::size_t vocab_;
  int fail_after_;
};

}  // namespace kvfleet::test
