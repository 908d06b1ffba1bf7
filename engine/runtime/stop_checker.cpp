#include "engine/runtime/stop_checker.h"

#include <algorithm>

#include "kvfleet/tokenizer.h"

namespace kvfleet {

StopChecker::StopChecker(StopRules rules, const Tokenizer* tokenizer, bool detokenize, bool skip_special_tokens)
    : rules_(std::move(rules)) {
  if ((detokenize || !rules_.stop_strings.empty()) && tokenizer)
    decoder_ = std::make_unique<StreamDecoder>(*tokenizer, skip_special_tokens);
  if (decoder_ && !rules_.stop_strings.empty()) matcher_ = StopMatcher(rules_.stop_strings);
}

std::string StopChecker::flush() { return decoder_ ? decoder_->flush() : std::string(); }
StopChecker::StopChecker() = default;
StopChecker::StopChecker(StopChecker&&) noexcept = default;
StopChecker& StopChecker::operator=(StopChecker&&) noexcept = default;
StopChecker::~StopChecker() = default;

StopResult StopChecker::check(TokenId token, std::int32_t num_outputs, std::int64_t num_tokens) {
  auto has = [](const std::vector<TokenId>& v, TokenId t) { return std::find(v.begin(), v.end(), t) != v.end(); };
  StopResult r;
  // The token's text is decoded even when it ends the request (an eos or stop id, skipped or not by
  // skip_special_tokens): the stream's text is the decode of all its tokens.
  if (decoder_) r.text = decoder_->push(token);
  if (has(rules_.eos_ids, token) || has(rules_.stop_token_ids, token)) {
    r.reason = FinishReason::stop;
    return r;
  }
  if (decoder_ && !rules_.stop_strings.empty()) {
    // A match ending in the new text (the first stop string in the request's order when several do).
    if (const int hit = matcher_.feed(r.text); hit >= 0) {
      r.reason = FinishReason::stop;
      r.stop_string = rules_.stop_strings[static_cast<std::size_t>(hit)];
      return r;
    }
  }
  if (num_outputs >= rules_.max_tokens || num_tokens >= rules_.max_model_len) r.reason = FinishReason::length;
  return r;
}

}  // namespace kvfleet
