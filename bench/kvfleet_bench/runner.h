// The load generator: sends a Workload to one OpenAI endpoint from a single thread (one io_context,
// one coroutine per request), open loop at the drawn arrival times, optionally capped at
// max_concurrency requests in flight (a request that arrives while the cap is reached waits for a
// slot, as in `vllm bench serve`). A multi-turn chain sends its next turn when the previous one ends,
// with the conversation so far (the assistant's answers included) in front of the new message.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "bench/kvfleet_bench/client.h"
#include "bench/kvfleet_bench/workload.h"

namespace kvfleet::bench {

struct RunConfig {
  Target target;
  std::string model;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  std::size_t max_concurrency = 0;  // 0: no cap
  std::uint64_t seed = 0;
  std::size_t num_warmups = 0;      // requests sent (and not measured) before the run
  ClientConfig client;
};

struct Progress {
  std::size_t done = 0, total = 0, failed = 0, in_flight = 0;
  double elapsed = 0;
};

struct RunOutput {
  std::vector<RequestResult> results;  // one per request, in the order they were sent
  double duration = 0;                 // seconds from the first send to the last completion
  std::size_t max_in_flight = 0;
};

// The JSON body of one turn: the system text and the conversation so far are in `history`.
std::string request_body(const RunConfig& config, const std::vector<std::pair<std::string, std::string>>& history,
                         const Turn& turn, bool chat);

// Blocks until every request has finished. `on_progress` (optional) runs on the run's thread about
// every 200 ms and once at the end.
RunOutput run_benchmark(const RunConfig& config, const Workload& workload,
                        const std::function<void(const Progress&)>& on_progress = {});

// Raises RLIMIT_NOFILE to its hard limit (thousands of sockets); returns the new soft limit.
std::uint64_t raise_open_file_limit();

}  // namespace kvfleet::bench
