// Traces in the Mooncake (FAST'25) format, as aiperf's `mooncake_trace` reads them: one JSON object per
// line with `timestamp` (ms since the trace's start), `input_length`, `output_length` and `hash_ids`, one
// id per 512-token block of the prompt. Two requests that share a leading run of ids share that prefix.
//
// Replay turns each id into a fixed block of token ids (the same id gives the same tokens wherever it
// appears), so the prompts reuse exactly what the trace says they reuse, and sends them as token ids.
// `block_tokens` scales a 512-token block down for small machines; the last block keeps its share of
// input_length (a trace block of 200 tokens out of 512 becomes 200 * block_tokens / 512 tokens).
//
// The infinite-cache hit ratio is the prefix hit ratio a cache that never evicts would reach on the
// trace, from the hash ids alone: each request hits the leading blocks whose id chain an earlier request
// sent, up to the tokens that earlier request had in them; divided by all prompt tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::bench {

inline constexpr std::int32_t kMooncakeBlockTokens = 512;

struct TraceRequest {
  double timestamp_ms = 0;
  std::int64_t input_length = 0, output_length = 0;
  std::vector<std::int64_t> hash_ids;
};

// Throws std::invalid_argument naming `source` and the line for a line that is not such an object
// (a missing or mistyped field, a negative length, input_length that does not fit its hash_ids).
// Blank lines are skipped; `max_lines` > 0 stops after that many requests.
std::vector<TraceRequest> parse_mooncake_trace(std::istream& in, const std::string& source, std::size_t max_lines = 0);
TraceRequest parse_mooncake_line(const std::string& line, const std::string& where);

// Whether a trace line looks like the Mooncake format (has input_length) rather than kvfleet's older
// trace lines (input_len, timestamps in seconds).
bool is_mooncake_line(const std::string& line);

// The prompt tokens of each block of `r` at `block_tokens` tokens per trace block: full blocks and the
// scaled last block (at least 1 token).
std::vector<std::int32_t> block_lengths(const TraceRequest& r, std::int32_t block_tokens);

// The first `n` tokens of block `hash_id`, drawn from `vocabulary` by a hash of (seed, hash_id, position).
std::vector<TokenId> block_token_ids(std::int64_t hash_id, std::int32_t n, const std::vector<TokenId>& vocabulary,
                                     std::uint64_t seed);

// The whole prompt of `r`.
std::vector<TokenId> trace_prompt(const TraceRequest& r, std::int32_t block_tokens, const std::vector<TokenId>& vocabulary,
                                  std::uint64_t seed);

struct InfiniteCache {
  std::int64_t prompt_tokens = 0, hit_tokens = 0;
  double hit_ratio() const { return prompt_tokens > 0 ? static_cast<double>(hit_tokens) / prompt_tokens : 0.0; }
};
InfiniteCache infinite_cache(const std::vector<TraceRequest>& trace, std::int32_t block_tokens);

}  // namespace kvfleet::bench
