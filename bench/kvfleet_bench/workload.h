// Workloads: what to send, independent of how fast. A Workload is a list of Chains; a chain is one
// arrival (a session) whose turns run one after another, each turn extending the conversation. Every
// dataset but multi-turn has one turn per chain.
//
// Prompt text is built from "word tokens": vocabulary entries that decode to a space plus lowercase
// letters and encode back to themselves alone. Such words never merge across the space, so a text of
// N words is exactly N tokens and any concatenation keeps the counts (a system prompt plus a
// question is system_tokens + question_tokens).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/kvfleet_bench/mooncake_trace.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet::bench {

struct Turn {
  std::string user_text;  // the prompt (single turn) or the new user message
  std::int32_t user_tokens = 0;
  std::int32_t output_len = 0;
  std::vector<TokenId> prompt_ids{};  // Mooncake trace replay: the whole prompt as token ids (user_text empty)
};

struct Chain {
  std::string system_text;  // shared prefix (shared-prefix groups, trace prefix ids); may be empty
  std::int32_t system_tokens = 0;
  std::vector<Turn> turns;
  int group = -1;                 // shared-prefix group or trace prefix id index; -1: none
  std::optional<double> arrival;  // trace replay: seconds after the first request
};

struct Workload {
  std::string name;
  std::vector<Chain> chains;
  std::optional<InfiniteCache> infinite_cache{};  // Mooncake traces: what a cache that never evicts would hit
  std::size_t request_count() const;
  bool sends_token_ids() const;
};

struct WorkloadOptions {
  std::string dataset = "random";  // random | shared-prefix | multi-turn | trace | mixed-chat
  std::size_t num_prompts = 1000;
  bool num_prompts_set = false;  // --num-prompts was given: shared-prefix and trace honour it
  std::uint64_t seed = 0;
  std::int32_t random_input_len = 1024, random_output_len = 128;
  double random_range_ratio = 0.0;
  // SGLang's generated-shared-prefix defaults.
  std::int32_t num_groups = 64, prompts_per_group = 16, system_prompt_len = 2048, question_len = 128,
               output_len = 256;
  std::int32_t num_sessions = 16, turns = 4;  // multi-turn: each turn random_input_len user tokens
  // trace: Mooncake lines (timestamp ms, input_length, output_length, hash_ids; mooncake_trace.h) or
  // kvfleet's older lines (timestamp s, input_len, output_len[, prefix_id, prefix_len]), told apart by the first line.
  std::string trace_file;
  std::int32_t trace_block_tokens = kMooncakeBlockTokens;  // tokens per Mooncake hash id block
  double trace_time_scale = 1.0;                           // arrival gaps multiplied by this (0: all at once)
  std::int32_t trace_max_output = 0;                       // output lengths capped at this (0: no cap)
  // mixed-chat (workload_mixed.cpp): short chat turns with long prompts among them.
  std::int32_t mixed_short_input_len = 64, mixed_long_input_len = 1024;
  double mixed_long_fraction = 0.2;
};

class PromptBuilder {
 public:
  explicit PromptBuilder(const Tokenizer& tokenizer);
  // `tokens` word tokens drawn uniformly, each with its leading space.
  std::string text(std::int32_t tokens, std::mt19937_64& rng) const;
  std::size_t vocabulary_size() const { return words_.size(); }
  const std::vector<TokenId>& word_ids() const { return ids_; }  // the words' token ids, in the same order

 private:
  std::vector<std::string> words_;
  std::vector<TokenId> ids_;
};

// Throws std::invalid_argument on a bad option or trace line (naming the line).
Workload make_workload(const WorkloadOptions& options, const PromptBuilder& prompts);

// The first `tokens` words of a word-token text.
std::string first_words(const std::string& text, std::int32_t tokens);

}  // namespace kvfleet::bench
