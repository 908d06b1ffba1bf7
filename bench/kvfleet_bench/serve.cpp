#include "bench/kvfleet_bench/serve.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "bench/kvfleet_bench/preflight.h"
#include "bench/kvfleet_bench/progress.h"
#include "bench/kvfleet_bench/scrape.h"
#include "bench/kvfleet_bench/svg.h"
#include "bench/kvfleet_bench/workload_mixed.h"

namespace kvfleet::bench {
namespace fs = std::filesystem;

void add_serve_flags(CLI::App& app, ServeOptions& o) {
  WorkloadOptions& w = o.workload;
  app.add_option("--base-url", o.base_url, "Server (router or replica) base URL");
  app.add_option("--endpoint", o.endpoint, "/v1/completions or /v1/chat/completions")
      ->check(CLI::IsMember({"/v1/completions", "/v1/chat/completions"}));
  app.add_option("--model", o.model, "Model directory (also the tokenizer) or served model name")->required();
  app.add_option("--served-model-name", o.served_model_name, "The request's model field (default: --model's base name)");
  app.add_option("--tokenizer", o.tokenizer, "tokenizer.json or a directory holding one (default: --model-dir, --model)");
  app.add_option("--model-dir", o.model_dir, "Model directory to take the tokenizer from");
  app.add_option("--dataset-name", w.dataset, "random, shared-prefix, multi-turn, trace or mixed-chat")
      ->check(CLI::IsMember({"random", "shared-prefix", "multi-turn", "trace", "mixed-chat"}));
  app.add_option("--num-prompts", w.num_prompts,
                 "Requests (random; shared-prefix: spread over the groups, default groups x prompts per group; "
                 "trace: its first N lines; multi-turn: refused, use --num-sessions and --turns)")
      ->each([&w](const std::string&) { w.num_prompts_set = true; });
  app.add_option("--request-rate", o.request_rate, "Requests per second (inf: all at once)");
  app.add_option("--burstiness", o.burstiness, "Gamma shape of the gaps (1: Poisson)");
  app.add_option("--max-concurrency", o.max_concurrency, "Most requests in flight (0: no cap)");
  app.add_option("--seed", o.seed, "Seed of the workload and the arrivals");
  app.add_option("--num-warmups", o.num_warmups, "Requests sent before the measured run");
  app.add_option("--goodput", o.goodput, "SLOs: ttft:MS tpot:MS e2el:MS")->expected(1, 3);
  app.add_option("--metrics-url", o.metrics_urls, "Replica /metrics to scrape before and after (repeat)");
  app.add_option("--result-file", o.result_file, "Write the JSON result here");
  app.add_option("--plot-dir", o.plot_dir, "Write SVG (and PNG) plots here");
  app.add_flag("--save-detailed", o.save_detailed, "Per-request arrays in the JSON");
  app.add_option("--request-timeout", o.request_timeout_s, "Seconds one read may wait");
  app.add_option("--header", o.headers, "NAME:VALUE sent with every request (repeat), e.g. x-kvfleet-tenant:acme");
  app.add_flag("--skip-length-check", o.skip_length_check, "Send even requests longer than /v1/models' max_model_len");
  app.add_option("--random-input-len", w.random_input_len, "random / multi-turn: prompt (turn) tokens");
  app.add_option("--random-output-len", w.random_output_len, "random / multi-turn: output tokens");
  app.add_option("--random-range-ratio", w.random_range_ratio, "Lengths drawn from [len*(1-r), len*(1+r)]");
  app.add_option("--shared-prefix-num-groups", w.num_groups, "Groups (one system prompt each)");
  app.add_option("--shared-prefix-prompts-per-group", w.prompts_per_group, "Prompts per group");
  app.add_option("--shared-prefix-system-prompt-len,--system-prompt-len", w.system_prompt_len, "System prompt tokens");
  app.add_option("--shared-prefix-question-len,--question-len", w.question_len, "Question tokens");
  app.add_option("--shared-prefix-output-len,--output-len", w.output_len, "Output tokens (shared-prefix)");
  app.add_option("--num-sessions", w.num_sessions, "multi-turn: sessions");
  app.add_option("--turns", w.turns, "multi-turn: turns per session");
  app.add_option("--trace-file", w.trace_file,
                 "JSONL: Mooncake lines (timestamp ms, input_length, output_length, hash_ids) or "
                 "timestamp (s), input_len, output_len[, prefix_id, prefix_len]");
  app.add_option("--trace-block-tokens", w.trace_block_tokens,
                 "Mooncake traces: tokens per hash id block (512 in the trace; fewer scales prompts down)");
  app.add_option("--trace-time-scale", w.trace_time_scale, "Trace arrival gaps multiplied by this (0: all at once)");
  app.add_option("--trace-max-output", w.trace_max_output, "Trace output lengths capped at this (0: no cap)");
  add_mixed_chat_flags(app, w);
}

std::string tokenizer_path(const ServeOptions& o) {
  if (!o.tokenizer.empty()) return o.tokenizer;
  if (!o.model_dir.empty()) return o.model_dir;
  return o.model;
}

std::string served_model(const ServeOptions& o) {
  if (!o.served_model_name.empty()) return o.served_model_name;
  fs::path p(o.model);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  return fs::is_directory(o.model) ? p.filename().string() : o.model;
}

void write_run_plots(const std::string& dir, const std::string& name, const RunOutput& run) {
  fs::create_directories(dir);
  std::vector<double> ttft, itl, e2el;
  for (const RequestResult& r : run.results) {
    if (!r.success) continue;
    ttft.push_back(r.ttft * 1000);
    e2el.push_back(r.latency * 1000);
    for (double g : r.itl) itl.push_back(g * 1000);
  }
  const fs::path base = fs::path(dir) / name;
  auto cdf = [&](const char* metric, const std::vector<double>& values) {
    const LineChart chart{std::string(metric) + " CDF", std::string(metric) + " (ms)", "fraction of requests",
                          {cdf_series(metric, values)}};
    write_chart(base.string() + "_" + metric + "_cdf.svg", render_svg(chart));
    write_chart(base.string() + "_" + metric + "_hist.svg",
                render_histogram_svg(std::string(metric) + " histogram", std::string(metric) + " (ms)", values));
  };
  cdf("ttft", ttft);
  cdf("itl", itl);
  cdf("e2el", e2el);
  Series tput{"output tok/s", {}, output_tokens_per_second(run)};
  for (std::size_t i = 0; i < tput.y.size(); ++i) tput.x.push_back(static_cast<double>(i));
  const LineChart chart{"Output throughput over time", "seconds since start", "tokens / s", {tput}};
  write_chart(base.string() + "_throughput.svg", render_svg(chart));
}

namespace {

// The server's max_model_len, from its /v1/models (a router may not report one: then from the
// --metrics-url replicas'), against the workload's longest request. A server that does not say is
// not checked, with a note.
void check_server_lengths(const ServeOptions& o, const std::string& model, const WorkloadOptions& wo, const Workload& w) {
  std::string why;
  std::optional<std::int64_t> max_len = fetch_max_model_len(o.base_url, model, &why);
  if (!max_len) max_len = smallest_max_model_len(o.metrics_urls, model);
  if (!max_len) {
    std::cerr << "kvfleet-bench: not checking prompt lengths against the context length: " << why << "\n";
    return;
  }
  check_lengths(w, wo, *max_len);
}

}  // namespace

ServeReport run_serve(const ServeOptions& o, std::ostream& log) {
  const Goodput goodput = parse_goodput(o.goodput);
  RunConfig config;
  config.target = parse_target(o.base_url, o.endpoint);
  config.model = served_model(o);
  config.request_rate = o.request_rate;
  config.burstiness = o.burstiness;
  config.max_concurrency = o.max_concurrency;
  config.seed = o.seed;
  config.num_warmups = o.num_warmups;
  config.client.io_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.request_timeout_s * 1000));
  for (const std::string& h : o.headers) {
    const auto colon = h.find(':');
    if (colon == std::string::npos || colon == 0)
      throw std::invalid_argument("--header " + h + ": expected NAME:VALUE, e.g. x-kvfleet-tenant:acme");
    std::string value = h.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    config.client.headers.emplace_back(h.substr(0, colon), value);
  }
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_path(o));
  const PromptBuilder prompts(tokenizer);
  WorkloadOptions wo = o.workload;
  wo.seed = o.seed;
  const Workload workload = make_workload(wo, prompts);
  if (workload.sends_token_ids() && config.target.chat())
    throw std::invalid_argument("a Mooncake trace sends its prompts as token ids: use --endpoint /v1/completions");
  if (!o.skip_length_check) check_server_lengths(o, config.model, wo, workload);
  raise_open_file_limit();

  std::vector<FleetCounters> before;
  for (const std::string& url : o.metrics_urls) before.push_back(scrape_metrics(url));
  std::function<void(const Progress&)> progress;
  if (o.progress) progress = progress_printer(std::cerr, ::isatty(STDERR_FILENO) == 1);
  ServeReport report;
  report.run = run_benchmark(config, workload, progress);
  std::vector<FleetCounters> after;
  for (const std::string& url : o.metrics_urls) after.push_back(scrape_metrics(url));

  report.result = compute_result(report.run, goodput);
  if (!o.metrics_urls.empty()) report.result.fleet = counters_delta(before, after);
  if (workload.infinite_cache) report.result.infinite_cache_hit_ratio = workload.infinite_cache->hit_ratio();
  RunInfo info{config.model, o.base_url, o.endpoint, wo.dataset, o.request_rate, o.burstiness, o.max_concurrency,
               workload.request_count(), o.seed};
  report.json = result_json(report.result, info, report.run, o.save_detailed);
  print_result(log, report.result);
  if (!o.result_file.empty()) {
    if (fs::path(o.result_file).has_parent_path()) fs::create_directories(fs::path(o.result_file).parent_path());
    std::ofstream out(o.result_file);
    if (!(out << boost::json::serialize(report.json) << "\n")) throw std::runtime_error("cannot write " + o.result_file);
  }
  if (!o.plot_dir.empty()) write_run_plots(o.plot_dir, "serve", report.run);
  return report;
}

}  // namespace kvfleet::bench
