// One choice of a completion while it is generated: its tokens, the text decoded so far, and the part of that
// text that is safe to send (a possible beginning of a stop string is held back until it is resolved).
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
  // `stop`: the request's stop strings, matched on the text the engine decoded.
  explicit ChoiceStream(std::vector<std::string> stop);

  // Takes one engine output (its text decoded by the engine: GenerationRequest::detokenize); returns the
  // text that may be sent now.
  std::string push(const RequestOutput& output);

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
  std::vector<std::string> stop_;
  std::size_t hold_ = 0;      // bytes held back: the longest stop string minus one
  std::string decoded_;       // all text decoded so far
  std::string sent_;          // the prefix of decoded_ already returned
  std::vector<TokenId> tokens_;
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
