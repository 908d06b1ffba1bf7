// `kvfleet-bench serve`: build the workload, scrape /metrics, run, scrape again, then print the
// result table, write the JSON (--result-file) and the plots (--plot-dir).
#pragma once

#include <boost/json/object.hpp>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "bench/kvfleet_bench/result.h"
#include "bench/kvfleet_bench/workload.h"

namespace CLI {
class App;
}

namespace kvfleet::bench {

struct ServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;              // a model directory (tokenizer too) or a served model name
  std::string served_model_name;  // the "model" field; default: --model's base name
  std::string tokenizer;          // tokenizer.json or a directory; default: --model-dir, then --model
  std::string model_dir;
  WorkloadOptions workload;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  std::size_t max_concurrency = 0;
  std::uint64_t seed = 0;
  std::size_t num_warmups = 0;
  std::vector<std::string> goodput;      // ttft:MS tpot:MS e2el:MS
  std::vector<std::string> metrics_urls;  // replica /metrics, scraped before and after
  std::string result_file, plot_dir;
  bool save_detailed = false;
  double request_timeout_s = 600;
  bool progress = true;
  std::vector<std::string> headers;  // NAME:VALUE, sent with every request (e.g. x-kvfleet-tenant:acme)
  bool skip_length_check = false;  // false: refuse a workload longer than the server's max_model_len (preflight.h)
};

struct ServeReport {
  BenchResult result;
  RunOutput run;
  boost::json::object json;
};

void add_serve_flags(CLI::App& app, ServeOptions& options);
// The tokenizer path and the served model name the options resolve to.
std::string tokenizer_path(const ServeOptions& options);
std::string served_model(const ServeOptions& options);

// Runs the benchmark; `log` gets the result table. Throws std::invalid_argument on bad options.
ServeReport run_serve(const ServeOptions& options, std::ostream& log);

// ttft/itl/e2el CDFs and histograms, output tokens per second: NAME_*.svg (+ .png) under `dir`.
void write_run_plots(const std::string& dir, const std::string& name, const RunOutput& run);

}  // namespace kvfleet::bench
