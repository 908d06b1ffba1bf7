#include "engine/runtime/stop_checker.h"

#include <algorithm>

#include "kvfleet/tokenizer.h"

namespace kvfleet {

StopChecker::StopChecker(StopRules rules, const Tokenizer* tokenizer, bool detokenize, bool skip_special_tokens)
    : rules_(std::move(rules)) {
  if ((detokenize || !rules_.stop_strings.empty()) && tokenizer)
    decoder_ = std::make_unique<StreamDecoder>(*tokenizer, skip_special_tokens);
  if (decoder_ && !rules_.stop_strings.empty()) {
    matcher_ = StopMatcher(rules_.stop_strings);
    for (const auto& s : rules_.stop_strings) hold_ = std::max(hold_, s.empty() ? 0 : s.size() - 1);
  }
}

std::string StopChecker::flush() {
  if (!decoder_ || matched_) return {};
  held_ += decoder_->flush();
  return release(true);
}

// The held text that may be shown: all of it, or all but its last hold_ bytes (whole UTF-8 characters).
std::string StopChecker::release(bool all) {
  std::size_t end = held_.size();
  if (!all) {
    end = end > hold_ ? end - hold_ : 0;
    while (end > 0 && (static_cast<unsigned char>(held_[end]) & 0xC0) == 0x80) --end;
  }
  std::string out = held_.substr(0, end);
  held_.erase(0, end);
  return out;
}
std::string StopChecker::prime(const std::vector<TokenId>& outputs, std::int64_t num_prompt) {
  std::string text;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto n = static_cast<std::int32_t>(i + 1);
    StopResult r = check(outputs[i], n, num_prompt + n);
    if (r.reason != FinishReason::none)
      throw std::invalid_argument("the resumed output would have ended at its token " + std::to_string(n) + " (" +
                                  to_string(r.reason) + ")");
    text += r.text;
  }
  return text;
}

StopChecker::StopChecker() = default;
StopChecker::StopChecker(StopChecker&&) noexcept = default;
StopChecker& StopChecker::operator=(StopChecker&&) noexcept = default;
StopChecker::~StopChecker() = default;

StopResult StopChecker::check(TokenId token, std::int32_t num_outputs, std::int64_t num_tokens, bool grammar_ended) {
  auto has = [](const std::vector<TokenId>& v, TokenId t) { return std::find(v.begin(), v.end(), t) != v.end(); };
  StopResult r;
  // The token's text is decoded even when it ends the request (an eos or stop id, skipped or not by
  // skip_special_tokens): the stream's text is the decode of all its tokens.
  std::string piece = decoder_ ? decoder_->push(token) : std::string();
  held_ += piece;
  if (has(rules_.eos_ids, token) || has(rules_.stop_token_ids, token)) {
    r.reason = FinishReason::stop;
    r.text = release(true);
    return r;
  }
  if (decoder_ && !rules_.stop_strings.empty()) {
    // A match ending in the new text (the first stop string in the request's order when several do). The
    // held text reaches back hold_ bytes before the piece, so the whole match lies in it; an earlier
    // occurrence would have ended the request earlier.
    if (const int hit = matcher_.feed(piece); hit >= 0) {
      r.reason = FinishReason::stop;
      r.stop_string = rules_.stop_strings[static_cast<std::size_t>(hit)];
      held_.resize(std::min(held_.size(), held_.find(r.stop_string)));
      r.text = release(true);
      matched_ = true;
      return r;
    }
  }
  // The grammar's end after the stop strings: a stop string inside its last piece still cuts the text.
  if (grammar_ended) r.reason = FinishReason::stop;
  else if (num_outputs >= rules_.max_tokens || num_tokens >= rules_.max_model_len) r.reason = FinishReason::length;
  r.text = release(r.reason != FinishReason::none);
  return r;
}

}  // namespace kvfleet
