// The load generator against a stand-in server with scripted token timings: what it measures equals
// the script (within scheduling noise on a shared machine), and what it sends is what it was asked.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>

#include "bench/kvfleet_bench/arrivals.h"
#include "bench/kvfleet_bench/result.h"
#include "bench/kvfleet_bench/runner.h"
#include "stand_in_server.h"

using namespace kvfleet::bench;
using kvfleet::test::StandInServer;
using kvfleet::test::StreamScript;

namespace {

Workload single_turns(int n, int output_len) {
  Workload w{"test", {}};
  for (int i = 0; i < n; ++i) {
    Chain c;
    c.turns.push_back(Turn{" hello world", 2, output_len});
    w.chains.push_back(std::move(c));
  }
  return w;
}

RunConfig config_for(const std::string& url, const std::string& endpoint) {
  RunConfig c;
  c.target = parse_target(url, endpoint);
  c.model = "stand-in";
  return c;
}

}  // namespace

TEST_CASE("scripted timings come back as TTFT, ITL, TPOT, latency and throughput") {
  StreamScript script;  // first token at 200 ms, then 5 more 50 ms apart
  StandInServer server(script);
  const RunOutput run = run_benchmark(config_for(server.url(), "/v1/completions"), single_turns(8, 6));
  REQUIRE(run.results.size() == 8);
  for (const RequestResult& r : run.results) {
    REQUIRE_MESSAGE(r.success, r.error_kind << ": " << r.error);
    CHECK(r.ttft == doctest::Approx(0.200).epsilon(0.25));
    CHECK(r.itl.size() == 5);
    CHECK(r.output_tokens == 6);
    CHECK(r.prompt_tokens == 100);
    CHECK(r.text == "t0t1t2t3t4t5");
    CHECK(r.replica == "http://stand-in:1");
    CHECK(r.latency == doctest::Approx(0.450).epsilon(0.25));
  }
  CHECK(run.max_in_flight == 8);
  const BenchResult b = compute_result(run, Goodput{});
  CHECK(b.completed == 8);
  CHECK(b.failed == 0);
  CHECK(b.total_input_tokens == 800);
  CHECK(b.total_output_tokens == 48);
  CHECK(b.ttft_ms.median == doctest::Approx(200).epsilon(0.25));
  CHECK(b.itl_ms.mean == doctest::Approx(50).epsilon(0.25));
  CHECK(b.tpot_ms.mean == doctest::Approx(50).epsilon(0.25));
  CHECK(b.duration == doctest::Approx(0.45).epsilon(0.25));
  CHECK(b.request_throughput == doctest::Approx(8 / b.duration));
  CHECK(b.output_throughput == doctest::Approx(48 / b.duration));
  CHECK(b.per_replica.at("http://stand-in:1") == 8);

  // Every body asks for exactly output_len streamed tokens with usage.
  REQUIRE(script.bodies.size() == 8);
  const auto body = boost::json::parse(script.bodies[0]).as_object();
  CHECK(body.at("model") == "stand-in");
  CHECK(body.at("prompt") == " hello world");
  CHECK(body.at("max_tokens") == 6);
  CHECK(body.at("ignore_eos") == true);
  CHECK(body.at("stream") == true);
  CHECK(body.at("stream_options").at("include_usage") == true);
}

TEST_CASE("goodput counts the requests that meet every SLO") {
  StreamScript script;
  StandInServer server(script);
  const RunOutput run = run_benchmark(config_for(server.url(), "/v1/completions"), single_turns(4, 6));
  const BenchResult strict = compute_result(run, parse_goodput({"ttft:50"}));  // scripted TTFT is 200 ms
  CHECK(strict.request_goodput == 0);
  const BenchResult loose = compute_result(run, parse_goodput({"ttft:2000", "tpot:500", "e2el:5000"}));
  CHECK(loose.request_goodput == doctest::Approx(loose.request_throughput));
  CHECK_THROWS_AS(parse_goodput({"ttfb:3"}), std::invalid_argument);
}

TEST_CASE("max concurrency caps the requests in flight and serialises the rest") {
  StreamScript script;
  script.first = std::chrono::milliseconds(100);
  script.gap = std::chrono::milliseconds(20);
  script.tokens = 3;
  StandInServer server(script);
  RunConfig c = config_for(server.url(), "/v1/completions");
  c.max_concurrency = 2;
  const RunOutput run = run_benchmark(c, single_turns(6, 3));
  CHECK(run.max_in_flight == 2);
  // Three waves of 140 ms each.
  CHECK(run.duration >= 0.40);
  CHECK(run.duration < 1.0);
}

TEST_CASE("open-loop arrivals: requests start at the drawn times") {
  StreamScript script;
  script.first = std::chrono::milliseconds(5);
  script.gap = std::chrono::milliseconds(5);
  script.tokens = 2;
  StandInServer server(script);
  RunConfig c = config_for(server.url(), "/v1/completions");
  c.request_rate = 40;
  c.seed = 11;
  const RunOutput run = run_benchmark(c, single_turns(40, 2));
  const std::vector<double> planned = kvfleet::bench::arrival_times(40, 40, 1.0, 11);
  REQUIRE(run.results.size() == planned.size());
  for (std::size_t i = 0; i < planned.size(); ++i) CHECK(std::abs(run.results[i].start - planned[i]) < 0.05);
  CHECK(run.duration > planned.back());
}

TEST_CASE("errors are counted by kind: HTTP status, refused connection, stream without [DONE]") {
  StreamScript script;
  script.first = std::chrono::milliseconds(1);
  script.gap = std::chrono::milliseconds(1);
  StandInServer server(script);
  const RunOutput busy = run_benchmark(config_for(server.url() + "/busy", "/v1/completions"), single_turns(3, 6));
  const BenchResult b = compute_result(busy, Goodput{});
  CHECK(b.failed == 3);
  CHECK(b.errors.at("http_503") == 3);

  const RunOutput refused = run_benchmark(config_for("http://127.0.0.1:1", "/v1/completions"), single_turns(2, 6));
  CHECK(compute_result(refused, Goodput{}).errors.at("connect") == 2);

  script.send_done = false;
  const RunOutput cut = run_benchmark(config_for(server.url(), "/v1/completions"), single_turns(2, 6));
  CHECK(compute_result(cut, Goodput{}).errors.at("incomplete") == 2);
}

TEST_CASE("multi-turn chat: each turn carries the conversation so far, answers included") {
  StreamScript script;
  script.first = std::chrono::milliseconds(1);
  script.gap = std::chrono::milliseconds(1);
  script.tokens = 2;
  StandInServer server(script);
  Workload w{"multi-turn", {}};
  Chain c;
  c.system_text = " be brief";
  c.turns = {Turn{" first question", 2, 2}, Turn{" second question", 2, 2}};
  w.chains.push_back(c);
  const RunOutput run = run_benchmark(config_for(server.url(), "/v1/chat/completions"), w);
  REQUIRE(run.results.size() == 2);
  CHECK(run.results[0].success);
  CHECK(run.results[1].success);
  REQUIRE(script.bodies.size() == 2);
  const auto second = boost::json::parse(script.bodies[1]).as_object();
  const auto& messages = second.at("messages").as_array();
  REQUIRE(messages.size() == 4);
  CHECK(messages[0].at("role") == "system");
  CHECK(messages[1].at("content") == " first question");
  CHECK(messages[2].at("role") == "assistant");
  CHECK(messages[2].at("content") == "t0t1");
  CHECK(messages[3].at("content") == " second question");
}

TEST_CASE("two thousand concurrent streams from one thread") {
  REQUIRE(raise_open_file_limit() >= 4200);  // both ends of every connection live in this process
  StreamScript script;
  script.first = std::chrono::milliseconds(1500);  // every stream is open at once before any token comes
  script.gap = std::chrono::milliseconds(10);
  script.tokens = 2;
  StandInServer server(script);
  const RunOutput run = run_benchmark(config_for(server.url(), "/v1/completions"), single_turns(2000, 2));
  const BenchResult b = compute_result(run, Goodput{});
  CHECK(b.completed == 2000);
  CHECK(b.failed == 0);
  CHECK(run.max_in_flight == 2000);
  CHECK(b.total_output_tokens == 4000);
}
