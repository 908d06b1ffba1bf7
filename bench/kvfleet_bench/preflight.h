// Checks made before a benchmark sends anything, so that a run that cannot succeed stops with a
// sentence saying what to change instead of N identical HTTP 400s: the server's context length
// (/v1/models' max_model_len, which kvfleet-replica and vLLM report) against the longest request of
// the workload.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/kvfleet_bench/workload.h"

namespace kvfleet::bench {

// GET BASE_URL/v1/models and return max_model_len of the entry named `model` (or of the only/first
// entry). nullopt when the server does not say; `why` (if given) then says what was missing.
std::optional<std::int64_t> fetch_max_model_len(const std::string& base_url, const std::string& model, std::string* why);

// The same, asked of several servers (the replicas behind a router, e.g. the --metrics-url ones):
// the smallest value any of them reports.
std::optional<std::int64_t> smallest_max_model_len(const std::vector<std::string>& base_urls, const std::string& model);

struct LongestRequest {
  std::int64_t prompt_tokens = 0;  // text tokens: system + conversation so far + the new turn
  std::int64_t output_tokens = 0;
  std::size_t chain = 0;
  std::size_t turn = 0;
  std::int64_t total() const { return prompt_tokens + output_tokens; }
};
LongestRequest longest_request(const Workload& workload);

// Throws std::invalid_argument when the longest request cannot fit in max_model_len, naming the flags
// of `options.dataset` to change. It counts the text's tokens, which the workload knows exactly; a chat
// template or a BOS token adds a few more, so a request within a few tokens of the limit can still be
// refused by the server (the summary then shows the server's message).
void check_lengths(const Workload& workload, const WorkloadOptions& options, std::int64_t max_model_len);

}  // namespace kvfleet::bench
