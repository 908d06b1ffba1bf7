// Decides when a request stops: end-of-sequence ids, stop token ids, stop strings (matched on the decoded
// text, across token boundaries, at a cost per token that does not grow with their number), max_tokens and the model's context length.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/runtime/stop_matcher.h"
#include "kvfleet/block_hash.h"
#include "kvfleet/sequence.h"

namespace kvfleet {

class Tokenizer;
class StreamDecoder;

struct StopRules {
  std::vector<TokenId> eos_ids;  // empty when ignore_eos
  std::vector<TokenId> stop_token_ids;
  std::vector<std::string> stop_strings;
  std::int32_t max_tokens = 16;
  std::int64_t max_model_len = 0;
};

struct StopResult {
  FinishReason reason = FinishReason::none;
  std::string stop_string;  // the stop string that matched
  std::string text;         // what the token added to the decoded text (when the checker decodes)
};

class StopChecker {
 public:
  StopChecker();  // defined where StreamDecoder is complete (clang instantiates ~unique_ptr here)
  // Decodes the output (once, for stop strings and for RequestOutput::text) when there are stop strings
  // or `detokenize`, with skip_special_tokens as given.
  StopChecker(StopRules rules, const Tokenizer* tokenizer, bool detokenize = false, bool skip_special_tokens = false);
  StopChecker(StopChecker&&) noexcept;
  StopChecker& operator=(StopChecker&&) noexcept;
  ~StopChecker();

  // Called with each sampled token; num_outputs and num_tokens count it already.
  StopResult check(TokenId token, std::int32_t num_outputs, std::int64_t num_tokens);
  // The decoder's held-back bytes at the end of the request (empty when it does not decode).
  std::string flush();

 private:
  StopRules rules_;
  std::unique_ptr<StreamDecoder> decoder_;  // only when there are stop strings
  StopMatcher matcher_;                     // all stop strings at once: cost per token = its text
};

}  // namespace kvfleet
