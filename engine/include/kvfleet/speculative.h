// Speculative decoding's settings: vLLM's --speculative-config keys, parsed and checked here so that the
// replica's flag, its YAML key and `kvfleet generate` refuse a bad value with the same words.
//
// Keys (JSON object, vLLM's names):
//   method                  "ngram" (prompt lookup). "suffix" and "draft_model" are refused: not built.
//   num_speculative_tokens  K >= 1 (at most 16): draft tokens proposed per sequence and step
//   prompt_lookup_max       N: the longest n-gram matched (default: prompt_lookup_min, or 5 when neither is set)
//   prompt_lookup_min       M: the shortest n-gram matched, 1 <= M <= N (default: prompt_lookup_max, or 5)
//   disable_by_batch_size   a step with at least this many running sequences does not speculate (decode is
//                           then compute-bound enough that verifying K more tokens per sequence costs more than
//                           it saves); default kDefaultDisableByBatchSize
// Any other key is refused (a setting kvfleet does not implement is never silently ignored).
#pragma once

#include <cstdint>
#include <string>

namespace kvfleet {

struct SpeculativeConfig {
  static constexpr std::int32_t kDefaultDisableByBatchSize = 4;
  static constexpr std::int32_t kMaxSpeculativeTokens = 16;

  std::string method;  // empty: speculation off
  std::int32_t num_speculative_tokens = 0;
  std::int32_t prompt_lookup_max = 5;
  std::int32_t prompt_lookup_min = 5;
  std::int32_t disable_by_batch_size = kDefaultDisableByBatchSize;

  bool enabled() const { return !method.empty(); }
};

// Parses a JSON object of the keys above. Throws std::invalid_argument naming the key ("speculative_config:
// num_speculative_tokens must be ...") for bad JSON, an unknown key, a wrong type or an out-of-range value.
SpeculativeConfig parse_speculative_config(const std::string& json_text);

// The same checks on an already filled config (the defaults resolved).
void validate(const SpeculativeConfig& config);

}  // namespace kvfleet
