// One streamed OpenAI request, timed the way `vllm bench serve` times it: TTFT is the arrival of the
// first SSE chunk that carries text, ITL the gaps between later text chunks, latency the time to the
// end of the stream. Token counts come from the final usage chunk (stream_options.include_usage), or
// are the number of text chunks when the server sends none; prompt tokens the server found cached come
// from usage.prompt_tokens_details.cached_tokens.
//
// Threading: stream_request runs on the caller's executor; nothing is shared between requests.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kvfleet::bench {

using Clock = std::chrono::steady_clock;

struct Target {
  std::string host;
  std::uint16_t port = 0;
  std::string path;  // "/v1/completions" or "/v1/chat/completions"
  bool chat() const { return path.find("chat") != std::string::npos; }
};

// "http://host:port[/prefix]" + endpoint; throws std::invalid_argument on anything else.
Target parse_target(const std::string& base_url, const std::string& endpoint);

struct RequestResult {
  bool success = false;
  std::string error_kind;  // connect | timeout | http_<status> | stream_error | incomplete | io
  std::string error;
  double start = 0;     // seconds after the run's start
  double ttft = 0;      // seconds
  double latency = 0;   // seconds, to the end of the stream
  std::vector<double> itl;  // seconds between text chunks
  std::int64_t prompt_tokens = -1;  // from usage; -1 when the server sent none
  std::int64_t output_tokens = 0;
  std::int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens; -1 when the server sent none
  std::string text;      // generated text (multi-turn feeds it back)
  std::string replica;   // the router's x-kvfleet-replica header
  int group = -1;        // the workload chain's group (shared prefix), for per-group analysis
};

struct ClientConfig {
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds io_timeout{600'000};  // each read: a long queue wait is not an error
  std::vector<std::pair<std::string, std::string>> headers;  // sent with every request (--header)
};

// Never throws for I/O or HTTP failures: they come back in `out` (success = false).
boost::asio::awaitable<void> stream_request(const Target& target, const std::string& body, Clock::time_point run_start,
                                            const ClientConfig& config, RequestResult& out);

}  // namespace kvfleet::bench
