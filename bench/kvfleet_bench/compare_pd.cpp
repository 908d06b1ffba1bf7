#include "bench/kvfleet_bench/compare_pd.h"

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "bench/kvfleet_bench/fleet.h"
#include "bench/kvfleet_bench/svg.h"
#include "bench/kvfleet_bench/workload_mixed.h"
#include "kvfleet/http/client.h"

namespace kvfleet::bench {
namespace fs = std::filesystem;
namespace {

struct ModeRun {
  std::string mode;
  BenchResult result;
  PdCounters pd;
  std::vector<double> short_itl_ms, short_ttft_ms, long_ttft_ms;
};

fs::path own_bin_dir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : self.parent_path();
}

// The value of a sample line "name{...} v" or "name v", summed into `sum` when `labels` (if given) is in it.
void add_samples(const std::string& text, const std::string& name, const std::string& labels, double& sum) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size(), name) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    if (!labels.empty() && line.find(labels) == std::string::npos) continue;
    try {
      sum += std::stod(line.substr(line.rfind(' ') + 1));
    } catch (const std::exception&) {
    }
  }
}

std::string get_metrics(const std::string& base_url) {
  const Target t = parse_target(base_url, "/metrics");
  return http::http_request(t.host, t.port, "GET", t.path).body;
}

std::vector<std::string> with(std::vector<std::string> v, std::initializer_list<std::string> more) {
  v.insert(v.end(), more);
  return v;
}

// One fleet: replicas (roles by mode) and the router in front; `urls` gets the replicas' URLs.
struct PdFleet {
  std::vector<std::unique_ptr<ServerProcess>> replicas;
  std::unique_ptr<ServerProcess> router;
  std::vector<std::string> decode_urls;
};

PdFleet start_fleet(const ComparePdOptions& o, const std::string& mode, const fs::path& model) {
  const fs::path bin = o.bin_dir.empty() ? own_bin_dir() : fs::path(o.bin_dir);
  const fs::path logs = fs::path(o.out_dir) / "logs";
  fs::create_directories(logs);
  const auto timeout = std::chrono::seconds(120);
  std::vector<std::string> common{(bin / "kvfleet-replica").string(), "--model", model.string(), "--port", "0",
                                  "--block-size=" + std::to_string(o.block_size),
                                  "--max-num-batched-tokens=" + std::to_string(o.max_num_batched_tokens),
                                  "--enable-chunked-prefill=true"};
  common.insert(common.end(), o.replica_flags.begin(), o.replica_flags.end());
  std::vector<std::string> router{(bin / "kvfleet-router").string(), "--model", model.string(), "--port", "0",
                                  "--block-size=" + std::to_string(o.block_size)};
  PdFleet f;
  const int n = o.prefill_replicas + o.decode_replicas;
  for (int i = 0; i < n; ++i) {
    const bool prefill = i < o.prefill_replicas;
    const std::string role = mode == "mixed" ? "mixed" : prefill ? "prefill" : "decode";
    const fs::path log = logs / fmt::format("{}-{}-{}.log", mode, role, i);
    f.replicas.push_back(std::make_unique<ServerProcess>(with(common, {"--role", role}), log, timeout));
    const std::string& url = f.replicas.back()->url();
    router.push_back(mode == "mixed" ? "--replica" : prefill ? "--prefill-replica" : "--decode-replica");
    router.push_back(url);
    if (mode == "mixed" || !prefill) f.decode_urls.push_back(url);
  }
  if (mode == "pd") router.push_back("--pd-threshold=" + std::to_string(o.pd_threshold));
  router.insert(router.end(), o.router_flags.begin(), o.router_flags.end());
  f.router = std::make_unique<ServerProcess>(router, logs / (mode + "-router.log"), timeout);
  return f;
}

ModeRun run_mode(const ComparePdOptions& o, const std::string& mode) {
  std::cerr << "== " << mode << ": starting " << o.prefill_replicas + o.decode_replicas << " replicas and the router\n";
  PdFleet fleet = start_fleet(o, mode, o.serve.model);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the router's first health checks
  ServeOptions so = o.serve;
  so.base_url = fleet.router->url();
  so.metrics_urls.clear();
  for (const auto& r : fleet.replicas) so.metrics_urls.push_back(r->url());
  so.result_file = (fs::path(o.out_dir) / (mode + ".json")).string();
  so.plot_dir.clear();
  ServeReport report = run_serve(so, std::cerr);
  ModeRun run{mode, report.result, {}, {}, {}, {}};
  for (const std::string& url : fleet.decode_urls) add_pd_counters(get_metrics(url), run.pd);
  add_router_decisions(get_metrics(fleet.router->url()), run.pd);
  fleet.router->stop();
  for (auto& r : fleet.replicas) r->stop();
  for (const RequestResult& r : report.run.results) {
    if (!r.success) continue;
    if (r.group == kLongPromptGroup) {
      run.long_ttft_ms.push_back(r.ttft * 1000);
      continue;
    }
    run.short_ttft_ms.push_back(r.ttft * 1000);
    for (const double gap : r.itl) run.short_itl_ms.push_back(gap * 1000);
  }
  return run;
}

std::string ms(double v) { return fmt::format("{:.1f}", v); }

std::string markdown(const ComparePdOptions& o, const std::vector<ModeRun>& runs) {
  const WorkloadOptions& w = o.serve.workload;
  std::string md = "# Prefill/decode disaggregation: pd mode vs mixed mode\n\n";
  md += fmt::format("{} prefill + {} decode replicas in pd mode (threshold {} tokens); {} mixed replicas in mixed mode. "
                    "Every replica: chunked prefill, {} tokens per step, block size {}. Workload `{}`",
                    o.prefill_replicas, o.decode_replicas, o.pd_threshold, o.prefill_replicas + o.decode_replicas,
                    o.max_num_batched_tokens, o.block_size, w.dataset);
  if (w.dataset == "mixed-chat")
    md += fmt::format(" ({} requests: {:.0f}% long prompts of {} tokens, the rest {} tokens; {} output tokens)",
                      w.num_prompts, w.mixed_long_fraction * 100, w.mixed_long_input_len, w.mixed_short_input_len,
                      w.random_output_len);
  md += fmt::format(", request rate {}, max concurrency {}, seed {}.\n\n", o.serve.request_rate, o.serve.max_concurrency,
                    o.serve.seed);
  md += "| mode | req/s | goodput req/s | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | ITL p99 | "
        "chat ITL p50 | chat ITL p99 | chat TTFT p99 | long TTFT p50 | transfers | GB moved | fallbacks | disaggregated / "
        "below threshold / no P | failed |\n";
  md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
  for (const ModeRun& r : runs) {
    const BenchResult& b = r.result;
    const Summary chat_itl = summarize(r.short_itl_ms), chat_ttft = summarize(r.short_ttft_ms);
    const Summary long_ttft = summarize(r.long_ttft_ms);
    md += fmt::format("| {} | {:.2f} | {:.2f} | {:.1f} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0f} | {:.3f} | "
                      "{:.0f} | {:.0f} / {:.0f} / {:.0f} | {} |\n",
                      r.mode, b.request_throughput, b.request_goodput, b.output_throughput, ms(b.ttft_ms.p50),
                      ms(b.ttft_ms.p99), ms(b.tpot_ms.p50), ms(b.tpot_ms.p99), ms(b.itl_ms.p50), ms(b.itl_ms.p99),
                      ms(chat_itl.p50), ms(chat_itl.p99), ms(chat_ttft.p99), ms(long_ttft.p50), r.pd.transfers,
                      r.pd.transfer_bytes / 1e9, r.pd.fallbacks, r.pd.disaggregated, r.pd.below_threshold,
                      r.pd.no_prefill_replica, b.failed);
  }
  md += "\nLatencies in ms. \"chat\": the short requests alone (their decodes are what a long prefill on the same "
        "replica stalls). Goodput counts requests within the --goodput SLOs";
  md += o.serve.goodput.empty() ? " (none given: 0)." : " (" + fmt::format("{}", fmt::join(o.serve.goodput, ", ")) + ").";
  md += "\n\nPlots: ![chat ITL CDF](chat_itl_cdf.svg) ![TTFT CDF](ttft_cdf.svg) ![latencies](latency.svg)\n";
  return md;
}

void write_plots(const ComparePdOptions& o, const std::vector<ModeRun>& runs) {
  LineChart itl{"ITL of the short chat requests", "ITL (ms)", "fraction of gaps", {}};
  LineChart ttft{"TTFT of the short chat requests", "TTFT (ms)", "fraction of requests", {}};
  BarChart bars{"Latency percentiles", "ms", {}, {{"chat ITL p50", {}, {}}, {"chat ITL p99", {}, {}}, {"TPOT p99", {}, {}}}};
  for (const ModeRun& r : runs) {
    itl.series.push_back(cdf_series(r.mode, r.short_itl_ms));
    ttft.series.push_back(cdf_series(r.mode, r.short_ttft_ms));
    bars.categories.push_back(r.mode);
    const Summary s = summarize(r.short_itl_ms);
    bars.series[0].y.push_back(s.p50);
    bars.series[1].y.push_back(s.p99);
    bars.series[2].y.push_back(r.result.tpot_ms.p99);
  }
  const fs::path dir(o.out_dir);
  write_chart(dir / "chat_itl_cdf.svg", render_svg(itl));
  write_chart(dir / "ttft_cdf.svg", render_svg(ttft));
  write_chart(dir / "latency.svg", render_svg(bars));
}

}  // namespace

void add_pd_counters(const std::string& text, PdCounters& c) {
  add_samples(text, "kvfleet_pd_transfers_total", "", c.transfers);
  add_samples(text, "kvfleet_pd_transfer_bytes_total", "", c.transfer_bytes);
  add_samples(text, "kvfleet_pd_fallbacks_total", "", c.fallbacks);
}

void add_router_decisions(const std::string& text, PdCounters& c) {
  const std::string name = "kvfleet_router_pd_decisions_total";
  add_samples(text, name, "reason=\"disaggregated\"", c.disaggregated);
  add_samples(text, name, "reason=\"below_threshold\"", c.below_threshold);
  add_samples(text, name, "reason=\"no_prefill_replica\"", c.no_prefill_replica);
}

void add_compare_pd_flags(CLI::App& app, ComparePdOptions& o) {
  add_serve_flags(app, o.serve);
  app.add_option("--bin-dir", o.bin_dir, "Folder of kvfleet-replica and kvfleet-router (default: this program's)");
  app.add_option("--prefill-replicas", o.prefill_replicas, "pd mode: prefill replicas")->check(CLI::PositiveNumber);
  app.add_option("--decode-replicas", o.decode_replicas, "pd mode: decode replicas")->check(CLI::PositiveNumber);
  app.add_option("--pd-threshold", o.pd_threshold, "pd mode: uncached prompt tokens on D beyond which P prefills");
  app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "Every replica's token budget per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--modes", o.modes, "Modes, in order (pd, mixed)")->delimiter(',')->check(CLI::IsMember({"pd", "mixed"}));
  app.add_option("--replica-flag", o.replica_flags, "A flag for every replica, e.g. --replica-flag=--num-kv-blocks=256")
      ->allow_extra_args(false);
  app.add_option("--router-flag", o.router_flags, "A flag for the router")->allow_extra_args(false);
  app.add_option("--block-size", o.block_size, "KV block size of replicas and router");
  app.add_option("--out-dir", o.out_dir, "Report folder");
}

int run_compare_pd(const ComparePdOptions& o) {
  fs::create_directories(o.out_dir);
  std::vector<ModeRun> runs;
  for (const std::string& mode : o.modes) runs.push_back(run_mode(o, mode));
  boost::json::object all;
  for (const ModeRun& r : runs) {
    std::ifstream in(fs::path(o.out_dir) / (r.mode + ".json"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    boost::json::object mode = boost::json::parse(text).as_object();
    mode["pd_transfers"] = r.pd.transfers;
    mode["pd_transfer_bytes"] = r.pd.transfer_bytes;
    mode["pd_fallbacks"] = r.pd.fallbacks;
    mode["router_pd_decisions"] = {{"disaggregated", r.pd.disaggregated}, {"below_threshold", r.pd.below_threshold},
                                   {"no_prefill_replica", r.pd.no_prefill_replica}};
    const Summary chat = summarize(r.short_itl_ms);
    mode["chat_p50_itl_ms"] = chat.p50;
    mode["chat_p99_itl_ms"] = chat.p99;
    all[r.mode] = std::move(mode);
  }
  write_plots(o, runs);
  const std::string md = markdown(o, runs);
  std::ofstream(fs::path(o.out_dir) / "report.md") << md;
  std::ofstream(fs::path(o.out_dir) / "results.json") << boost::json::serialize(all) << "\n";
  std::cout << md;
  bool ok = true;
  for (const ModeRun& r : runs) ok = ok && r.result.completed > 0;
  return ok ? 0 : 1;
}

}  // namespace kvfleet::bench
