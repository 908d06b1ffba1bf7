#include "engine/runtime/stop_checker.h"

#include <algorithm>

#include "kvfleet/tokenizer.h"

namespace kvfleet {

StopChecker::StopChecker(StopRules rules, const Tokenizer* tokenizer) : rules_(std::move(rules)) {
  if (!rules_.stop_strings.empty() && tokenizer) {
    decoder_ = std::make_unique<StreamDecoder>(*tokenizer);
    matcher_ = StopMatcher(rules_.stop_strings);
  }
}
StopChecker::StopChecker() = default;
StopChecker::StopChecker(StopChecker&&) noexcept = default;
StopChecker& StopChecker::operator=(StopChecker&&) noexcept = default;
StopChecker::~StopChecker() = default;

StopResult StopChecker::check(TokenId token, std::int32_t num_outputs, std::int64_t num_tokens) {
  auto has = [](const std::vector<TokenId>& v, TokenId t) { return std::find(v.begin(), v.end(), t) != v.end(); };
  if (has(rules_.eos_ids, token) || has(rules_.stop_token_ids, token)) return {FinishReason::stop, {}};
  if (decoder_) {
    // A match ending in the new text (the first stop string in the request's order when several do).
    if (const int hit = matcher_.feed(decoder_->push(token)); hit >= 0)
      return {FinishReason::stop, rules_.stop_strings[static_cast<std::size_t>(hit)]};
  }
  if (num_outputs >= rules_.max_tokens || num_tokens >= rules_.max_model_len) return {FinishReason::length, {}};
  return {};
}

}  // namespace kvfleet
