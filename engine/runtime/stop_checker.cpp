#include "engine/runtime/stop_checker.h"

#include <algorithm>

#include "kvfleet/tokenizer.h"

namespace kvfleet {

StopChecker::StopChecker(StopRules rules, const Tokenizer* tokenizer) : rules_(std::move(rules)) {
  if (!rules_.stop_strings.empty() && tokenizer) decoder_ = std::make_unique<StreamDecoder>(*tokenizer);
}
StopChecker::StopChecker() = default;
StopChecker::StopChecker(StopChecker&&) noexcept = default;
StopChecker& StopChecker::operator=(StopChecker&&) noexcept = default;
StopChecker::~StopChecker() = default;

StopResult StopChecker::check(TokenId token, std::int32_t num_outputs, std::int64_t num_tokens) {
  auto has = [](const std::vector<TokenId>& v, TokenId t) { return std::find(v.begin(), v.end(), t) != v.end(); };
  if (has(rules_.eos_ids, token) || has(rules_.stop_token_ids, token)) return {FinishReason::stop, {}};
  if (decoder_) {
    // Only the tail can hold a new match: the new text plus the longest stop string's length before it.
    const std::size_t old_size = text_.size();
    text_ += decoder_->push(token);
    for (const auto& s : rules_.stop_strings) {
      const std::size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
      if (!s.empty() && text_.find(s, from) != std::string::npos) return {FinishReason::stop, s};
    }
  }
  if (num_outputs >= rules_.max_tokens || num_tokens >= rules_.max_model_len) return {FinishReason::length, {}};
  return {};
}

}  // namespace kvfleet
