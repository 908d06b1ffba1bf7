// From per-request measurements to the numbers `vllm bench serve` reports, under its JSON key names
// where they overlap (completed, total_input_tokens, request_throughput, mean_ttft_ms, p99_itl_ms, ...),
// plus ours: errors by kind, per-replica request counts (the router's x-kvfleet-replica header), and
// the fleet's prefix-cache hit rate and preemptions over the run (from /metrics scrapes).
#pragma once

#include <boost/json/object.hpp>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/kvfleet_bench/runner.h"
#include "bench/kvfleet_bench/stats.h"

namespace kvfleet::bench {

// SLOs for goodput, in milliseconds: a request counts when it meets every one that is set.
struct Goodput {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};
// "ttft:500" "tpot:50" "e2el:2000"; throws std::invalid_argument on anything else.
Goodput parse_goodput(const std::vector<std::string>& items);

// Counter deltas summed over the scraped replicas (tokens for the prefix cache).
struct FleetCounters {
  double prefix_queries = 0, prefix_hits = 0, preemptions = 0;
  // kvfleet_kv_tier_hit_tokens_total by medium: prompt tokens found below the device pool (within prefix_hits).
  double tier_hits_host = 0, tier_hits_disk = 0, tier_hits_shared = 0;
};

struct RunInfo {  // what was asked for, echoed into the JSON
  std::string model, base_url, endpoint, dataset;
  double request_rate = 0, burstiness = 1;
  std::size_t max_concurrency = 0, num_prompts = 0;
  std::uint64_t seed = 0;
};

// One kind of failure as the server worded it: requests whose messages differ only in their numbers
// ("... 2177 tokens" / "... 2180 tokens") count together, shown with the first such message.
struct ErrorSample {
  std::string kind;     // as in BenchResult::errors
  std::string message;  // the server's error.message when it sent an OpenAI error object, else what failed
  std::size_t count = 0;
};
inline constexpr std::size_t kMaxErrorSamples = 5;

struct BenchResult {
  std::size_t completed = 0, failed = 0;
  std::int64_t total_input_tokens = 0, total_output_tokens = 0;
  std::int64_t total_cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens, summed
  std::size_t cached_reported = 0;       // completed requests whose usage said how many were cached
  double duration = 0, request_throughput = 0, request_goodput = 0, output_throughput = 0, total_token_throughput = 0;
  double max_output_tokens_per_s = 0;
  std::size_t max_concurrent_requests = 0;
  Summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::map<std::string, std::size_t> errors;       // kind -> count
  std::vector<ErrorSample> error_samples;          // the first kMaxErrorSamples distinct messages, in order seen
  std::map<std::string, std::size_t> per_replica;  // x-kvfleet-replica -> completed requests
  std::optional<FleetCounters> fleet;              // set when /metrics was scraped
  std::optional<double> infinite_cache_hit_ratio;  // the workload's (Mooncake traces), set by the caller
  std::optional<double> prefix_cache_hit_rate() const;
  // Cached prompt tokens over prompt tokens, from the responses' usage; nullopt when none reported it.
  std::optional<double> prompt_hit_ratio() const;
};

BenchResult compute_result(const RunOutput& run, const Goodput& goodput);

// The readable part of a failure: error.message of an OpenAI error object (HTTP body or stream event),
// otherwise the raw error text.
std::string error_message(const RequestResult& r);

// Output tokens finished in each whole second of the run (a chunk's tokens spread evenly over its chunks).
std::vector<double> output_tokens_per_second(const RunOutput& run);

// vllm's keys plus ours; `detailed` adds the per-request arrays (input_lens, output_lens, ttfts, itls,
// generated_texts, errors; ours: replicas, groups) that `vllm bench serve --save-detailed` writes.
boost::json::object result_json(const BenchResult& result, const RunInfo& info, const RunOutput& run, bool detailed);

// The table `vllm bench serve` prints.
void print_result(std::ostream& out, const BenchResult& result);

}  // namespace kvfleet::bench
