// Speculative decoding's settings: vLLM's --speculative-config keys, parsed and checked here so that the
// replica's flag, its YAML key and `kvfleet generate` refuse a bad value with the same words.
//
// Keys (JSON object, vLLM's names):
//   method                  "ngram" (prompt lookup), "suffix" (suffix decoding) or "draft_model" (a smaller
//                           model with the target's vocabulary drafts, engine/spec/draft_model.h)
//   num_speculative_tokens  K >= 1 (at most 16): draft tokens proposed per sequence and step; required for
//                           ngram and draft_model, for suffix it defaults to min(suffix_decoding_max_tree_depth, 16)
// draft_model only:
//   model                   the draft model's directory (required); its vocabulary size must be the target's
// ngram only:
//   prompt_lookup_max       N: the longest n-gram matched (default: prompt_lookup_min, or 5 when neither is set)
//   prompt_lookup_min       M: the shortest n-gram matched, 1 <= M <= N (default: prompt_lookup_max, or 5)
// suffix only (engine/spec/suffix_proposer.h):
//   suffix_decoding_max_tree_depth      D, 1 to 64 (default 24): the longest substring a suffix tree holds;
//                                       both the matched context and the drafts fit in it
//   suffix_decoding_max_cached_requests finished requests' outputs kept, replica-wide, oldest out first
//                                       (default 10000; 0: only the request's own prompt and outputs)
//   suffix_decoding_max_spec_factor     at most factor x (matched context length) drafts (default 1.0, > 0)
//   suffix_decoding_min_token_prob      drafting stops at a token whose estimated probability (the product of
//                                       the path's frequencies) is under this (default 0.1, 0 to 1)
// Both:
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
  std::int32_t suffix_max_tree_depth = 24;
  std::int32_t suffix_max_cached_requests = 10000;
  double suffix_max_spec_factor = 1.0;
  double suffix_min_token_prob = 0.1;
  std::string draft_model;  // JSON key "model"

  bool enabled() const { return !method.empty(); }
};

// Parses a JSON object of the keys above. Throws std::invalid_argument naming the key ("speculative_config:
// num_speculative_tokens must be ...") for bad JSON, an unknown key, a wrong type or an out-of-range value.
SpeculativeConfig parse_speculative_config(const std::string& json_text);

// The same checks on an already filled config (the defaults resolved).
void validate(const SpeculativeConfig& config);

}  // namespace kvfleet
