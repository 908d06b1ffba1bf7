#include "engine/server/reasoning_grammar.h"

#include <algorithm>

namespace kvfleet::server {
namespace {

class AfterReasoningMatcher final : public TokenMatcher {
 public:
  enum class Phase { undecided, reasoning, answer };

  AfterReasoningMatcher(std::unique_ptr<TokenMatcher> inner, ReasoningTokens tokens, std::size_t vocab)
      : inner_(std::move(inner)), tokens_(tokens), vocab_(vocab),
        initial_(tokens.starts_inside ? Phase::reasoning : Phase::undecided), phase_(initial_) {}

  void fill_next_token_mask(std::span<std::uint32_t> mask) override {
    if (phase_ == Phase::reasoning) {  // every token of the vocabulary
      std::fill(mask.begin(), mask.end(), 0u);
      for (std::size_t w = 0; w < mask.size() && w * 32 < vocab_; ++w)
        mask[w] = vocab_ - w * 32 >= 32 ? ~0u : (1u << (vocab_ - w * 32)) - 1;
      return;
    }
    inner_->fill_next_token_mask(mask);
    if (phase_ == Phase::undecided && tokens_.open) {
      const auto id = static_cast<std::size_t>(*tokens_.open);
      if (id / 32 < mask.size()) mask[id / 32] |= 1u << (id % 32);
    }
  }

  bool accept_token(TokenId id) override {
    switch (phase_) {
      case Phase::undecided:
        if (tokens_.open && id == *tokens_.open) {
          phase_ = Phase::reasoning;
          ++before_answer_;
          return true;
        }
        if (!inner_->accept_token(id)) return false;
        phase_ = Phase::answer;
        ++answer_;
        return true;
      case Phase::reasoning:
        if (id < 0 || static_cast<std::size_t>(id) >= vocab_) return false;
        ++before_answer_;
        if (id == tokens_.close) phase_ = Phase::answer;
        return true;
      case Phase::answer:
        if (!inner_->accept_token(id)) return false;
        ++answer_;
        return true;
    }
    return false;
  }

  void rollback(std::size_t n) override {
    const std::size_t in_answer = std::min(n, answer_);
    inner_->rollback(in_answer);
    answer_ -= in_answer;
    n -= in_answer;
    if (n > 0) before_answer_ -= std::min(n, before_answer_);
    if (answer_ == 0 && (n > 0 || before_answer_ == 0))  // back before the answer's first token
      phase_ = before_answer_ == 0 ? initial_ : Phase::reasoning;
  }

  bool is_terminated() const override { return phase_ == Phase::answer && inner_->is_terminated(); }

 private:
  std::unique_ptr<TokenMatcher> inner_;
  ReasoningTokens tokens_;
  std::size_t vocab_;
  Phase initial_, phase_;
  std::size_t before_answer_ = 0;  // tokens accepted before the answer (the reasoning and its tags)
  std::size_t answer_ = 0;         // tokens the inner grammar accepted
};

class AfterReasoningGrammar final : public TokenGrammar {
 public:
  AfterReasoningGrammar(std::shared_ptr<const TokenGrammar> inner, ReasoningTokens tokens)
      : inner_(std::move(inner)), tokens_(tokens) {}
  std::unique_ptr<TokenMatcher> make_matcher() const override {
    return std::make_unique<AfterReasoningMatcher>(inner_->make_matcher(), tokens_, inner_->vocab_size());
  }
  std::size_t vocab_size() const override { return inner_->vocab_size(); }

 private:
  std::shared_ptr<const TokenGrammar> inner_;
  ReasoningTokens tokens_;
};

}  // namespace

std::shared_ptr<const TokenGrammar> after_reasoning(std::shared_ptr<const TokenGrammar> inner, ReasoningTokens tokens) {
  return std::make_shared<AfterReasoningGrammar>(std::move(inner), tokens);
}

std::optional<ReasoningTokens> reasoning_tokens(std::string_view parser, const Tokenizer& tokenizer) {
  const auto open = tokenizer.token_to_id("<think>"), close = tokenizer.token_to_id("</think>");
  if (!open || !close) return std::nullopt;
  if (parser == "deepseek_r1") return ReasoningTokens{std::nullopt, *close, true};
  return ReasoningTokens{open, *close, false};
}

}  // namespace kvfleet::server
