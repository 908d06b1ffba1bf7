// One choice of a completion while it is generated: its tokens, logprobs and text so far. It only collects and
// formats: the engine's StopChecker decodes the text once and holds back a possible stop string's beginning,
// so every RequestOutput::text may be sent as it comes.
#pragma once

#include <boost/json/array.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet::server {

class ChoiceStream {
 public:
  // Takes one engine output (its text decoded by the engine: GenerationRequest::detokenize); returns the
  // text that may be sent now: the output's text.
  const std::string& push(const RequestOutput& output);
  // Resumption: the output tokens another replica streamed, this choice's own from now on (usage counts
  // them; with `logprobs`, each gets an empty entry: they were reported there). Their text comes with the
  // first output (RequestOutput::resumed_text). Before the first push.
  void resume(const std::vector<TokenId>& tokens, bool logprobs);
  // The token ids that no call has returned yet (a chunk's kvfleet_token_ids); resumed ones never.
  boost::json::array take_token_ids();

  bool finished() const { return finish_reason_.has_value(); }
  // "stop" | "length" | "abort"; empty until finished.
  std::string finish_reason() const { return finish_reason_.value_or(""); }
  const std::string& error() const { return error_; }
  const std::string& text() const { return sent_; }  // everything sent (the final text once finished)
  const std::vector<TokenId>& tokens() const { return tokens_; }
  const std::vector<RequestOutput::Logprobs>& logprobs() const { return logprobs_; }
  std::int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  std::int32_t num_cached_tokens() const { return num_cached_tokens_; }

 private:
  std::string sent_;  // the text so far
  std::vector<TokenId> tokens_;
  std::size_t ids_taken_ = 0;
  std::vector<RequestOutput::Logprobs> logprobs_;
  std::optional<std::string> finish_reason_;
  std::string error_;
  std::int32_t num_prompt_tokens_ = 0, num_cached_tokens_ = 0;
};

// The OpenAI logprobs objects for a choice's tokens.
boost::json::value completion_logprobs(const Tokenizer& tok, const std::vector<TokenId>& tokens,
                                       const std::vector<RequestOutput::Logprobs>& lps, std::size_t text_offset);
boost::json::value chat_logprobs(const Tokenizer& tok, const std::vector<TokenId>& tokens,
                                 const std::vector<RequestOutput::Logprobs>& lps);

}  // namespace kvfleet::server
