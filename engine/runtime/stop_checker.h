// Decides when a request stops: end-of-sequence ids, stop token ids, stop strings (matched on the decoded
// text, across token boundaries, at a cost per token that does not grow with their number), max_tokens and
// the model's context length. It is also the request's detokenizer: the text it returns is what a client may
// see, with a stop string's possible beginning held back and a matched stop string left out, so that the
// output side only formats (one object does both, as vLLM's detokenizer does).
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
  // The decoded text that may be shown now (when the checker decodes): text that could still be the
  // beginning of a stop string is held back until the next tokens resolve it, and a matched stop string and
  // whatever follows it are never shown (OpenAI's rule).
  std::string text;
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

  // Called with each sampled token; num_outputs and num_tokens count it already. `grammar_ended`: the
  // request's grammar terminated with this token, which then ends it as an end-of-sequence id does (stop).
  StopResult check(TokenId token, std::int32_t num_outputs, std::int64_t num_tokens, bool grammar_ended = false);
  // Everything still held back at the end of the request (the decoder's incomplete bytes, a possible stop
  // string's beginning), or nothing after a stop string matched. Empty when it does not decode.
  std::string flush();
  // A resumed request: reads outputs generated elsewhere (`num_prompt` tokens of prompt before them) as
  // check() would have, and returns the text they released. Throws std::invalid_argument when they
  // would already have ended the request.
  std::string prime(const std::vector<TokenId>& outputs, std::int64_t num_prompt);

 private:
  std::string release(bool all);

  StopRules rules_;
  std::unique_ptr<StreamDecoder> decoder_;  // when there are stop strings or the text is wanted
  StopMatcher matcher_;                     // all stop strings at once: cost per token = its text
  std::size_t hold_ = 0;                    // bytes held back: the longest stop string's length minus one
  std::string held_;                        // decoded, not yet shown
  bool matched_ = false;                    // a stop string ended the text: nothing more is shown
};

}  // namespace kvfleet
