#include "bench/kvfleet_bench/compare.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "bench/kvfleet_bench/fleet.h"
#include "bench/kvfleet_bench/svg.h"

namespace kvfleet::bench {
namespace fs = std::filesystem;
namespace {

struct PolicyRun {
  PolicyOutcome outcome;
  std::vector<double> ttft_ms;
  std::vector<std::size_t> per_replica;  // requests per replica, in start order
};

fs::path own_bin_dir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : self.parent_path();
}

std::string percent(double v) { return fmt::format("{:.1f}%", v * 100); }

PolicyRun run_policy(const CompareOptions& o, const std::string& policy) {
  FleetConfig fc;
  fc.bin_dir = o.bin_dir.empty() ? own_bin_dir() : fs::path(o.bin_dir);
  fc.model = o.serve.model;
  fc.replicas = o.replicas;
  fc.policy = policy;
  fc.replica_flags = o.replica_flags;
  fc.replica_flags.push_back("--block-size=" + std::to_string(o.block_size));
  fc.router_flags = o.router_flags;
  fc.router_flags.push_back("--block-size=" + std::to_string(o.block_size));
  fc.log_dir = fs::path(o.out_dir) / "logs";
  std::cerr << "== " << policy << ": starting " << o.replicas << " replicas and the router\n";
  Fleet fleet(fc);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the router's first health checks
  ServeOptions so = o.serve;
  so.base_url = fleet.router_url();
  so.metrics_urls = fleet.replica_urls();
  so.result_file = (fs::path(o.out_dir) / (policy + ".json")).string();
  so.plot_dir.clear();
  ServeReport report = run_serve(so, std::cerr);
  fleet.stop();
  PolicyRun run{{policy, report.result, replicas_per_group(report.run)}, {}, {}};
  for (const RequestResult& r : report.run.results)
    if (r.success) run.ttft_ms.push_back(r.ttft * 1000);
  for (const std::string& url : fleet.replica_urls()) {
    const auto it = report.result.per_replica.find(url);
    run.per_replica.push_back(it == report.result.per_replica.end() ? 0 : it->second);
  }
  return run;
}

void write_plots(const CompareOptions& o, const std::vector<PolicyRun>& runs) {
  LineChart cdf{"TTFT CDF by routing policy", "TTFT (ms)", "fraction of requests", {}};
  BarChart tput{"Output throughput", "tokens / s", {}, {{"output tok/s", {}, {}}}};
  BarChart ttft{"TTFT", "ms", {}, {{"p50", {}, {}}, {"p99", {}, {}}}};
  BarChart hits{"Prefix-cache hit rate", "% of prompt tokens", {}, {{"hit rate", {}, {}}}};
  BarChart load{"Requests per replica", "requests", {}, {}};
  for (int i = 0; i < o.replicas; ++i) load.categories.push_back("replica " + std::to_string(i));
  for (const PolicyRun& r : runs) {
    const BenchResult& b = r.outcome.result;
    cdf.series.push_back(cdf_series(r.outcome.policy, r.ttft_ms));
    for (BarChart* c : {&tput, &ttft, &hits}) c->categories.push_back(r.outcome.policy);
    tput.series[0].y.push_back(b.output_throughput);
    ttft.series[0].y.push_back(b.ttft_ms.p50);
    ttft.series[1].y.push_back(b.ttft_ms.p99);
    hits.series[0].y.push_back(b.prefix_cache_hit_rate().value_or(0) * 100);
    Series s{r.outcome.policy, {}, {}};
    for (std::size_t n : r.per_replica) s.y.push_back(static_cast<double>(n));
    load.series.push_back(std::move(s));
  }
  const fs::path dir(o.out_dir);
  write_chart(dir / "ttft_cdf.svg", render_svg(cdf));
  write_chart(dir / "throughput.svg", render_svg(tput));
  write_chart(dir / "ttft.svg", render_svg(ttft));
  write_chart(dir / "hit_rate.svg", render_svg(hits));
  write_chart(dir / "replica_load.svg", render_svg(load));
}

}  // namespace

void add_compare_flags(CLI::App& app, CompareOptions& o) {
  add_serve_flags(app, o.serve);
  app.add_option("--bin-dir", o.bin_dir, "Folder of kvfleet-replica and kvfleet-router (default: this program's)");
  app.add_option("--replicas", o.replicas, "Replicas per fleet")->check(CLI::PositiveNumber);
  app.add_option("--policies", o.policies, "Router policies, in order")->delimiter(',');
  app.add_option("--replica-flag", o.replica_flags, "A flag for every replica, e.g. --replica-flag=--num-kv-blocks=256")
      ->allow_extra_args(false);
  app.add_option("--router-flag", o.router_flags, "A flag for the router, e.g. --router-flag=--http-threads=1")
      ->allow_extra_args(false);
  app.add_option("--block-size", o.block_size, "KV block size of replicas and router");
  app.add_option("--out-dir", o.out_dir, "Report folder");
}

double replicas_per_group(const RunOutput& run) {
  std::map<int, std::set<std::string>> groups;
  for (const RequestResult& r : run.results)
    if (r.success && r.group >= 0) groups[r.group].insert(r.replica);
  double sum = 0;
  for (const auto& [group, replicas] : groups) sum += static_cast<double>(replicas.size());
  return groups.empty() ? 0 : sum / static_cast<double>(groups.size());
}

double best_hit_rate(const Workload& workload, const Tokenizer& tokenizer, std::int32_t block_size) {
  std::map<int, std::vector<std::vector<TokenId>>> groups;
  double queries = 0, hits = 0;
  for (const Chain& c : workload.chains) {
    std::string prompt = c.system_text;
    for (const Turn& t : c.turns) prompt += t.user_text;  // single-turn workloads: the one prompt
    std::vector<TokenId> tokens = tokenizer.encode(prompt, true);
    queries += static_cast<double>(tokens.size());
    if (c.group >= 0) groups[c.group].push_back(std::move(tokens));
  }
  for (const auto& [group, prompts] : groups) {
    std::size_t common = prompts.front().size();
    for (const auto& p : prompts) {
      std::size_t n = 0;
      while (n < common && n < p.size() && p[n] == prompts.front()[n]) ++n;
      common = n;
    }
    const auto cached = static_cast<double>(common / static_cast<std::size_t>(block_size) * static_cast<std::size_t>(block_size));
    hits += static_cast<double>(prompts.size() - 1) * cached;
  }
  return queries > 0 ? hits / queries : 0;
}

std::string markdown_report(const CompareOptions& o, const std::vector<PolicyOutcome>& outcomes, double best) {
  const WorkloadOptions& w = o.serve.workload;
  std::string md = "# Routing comparison\n\n";
  md += fmt::format("{} replicas, workload `{}`", o.replicas, w.dataset);
  if (w.dataset == "shared-prefix")
    md += fmt::format(" ({} groups x {} prompts, system prompt {} tokens, question {}, output {})", w.num_groups,
                      w.prompts_per_group, w.system_prompt_len, w.question_len, w.output_len);
  md += fmt::format(", request rate {}, max concurrency {}, seed {}. Best achievable hit rate: {}.\n\n",
                    o.serve.request_rate, o.serve.max_concurrency, o.serve.seed, percent(best));
  md += "| policy | req/s | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | E2EL p50 (ms) | hit rate | replicas per group | preemptions | failed | requests per replica |\n";
  md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const PolicyOutcome& p : outcomes) {
    const BenchResult& b = p.result;
    std::string load;
    for (const auto& [url, n] : b.per_replica) load += (load.empty() ? "" : " / ") + std::to_string(n);
    md += fmt::format("| {} | {:.2f} | {:.1f} | {:.0f} | {:.0f} | {:.0f} | {} | {:.2f} | {:.0f} | {} | {} |\n", p.policy,
                      b.request_throughput, b.output_throughput, b.ttft_ms.p50, b.ttft_ms.p99, b.e2el_ms.p50,
                      b.prefix_cache_hit_rate() ? percent(*b.prefix_cache_hit_rate()) : "n/a", p.replicas_per_group,
                      b.fleet ? b.fleet->preemptions : 0.0, b.failed, load);
  }
  const PolicyOutcome* ca = nullptr;
  const PolicyOutcome* rr = nullptr;
  for (const PolicyOutcome& p : outcomes) {
    if (p.policy == "cache_aware") ca = &p;
    if (p.policy == "round_robin") rr = &p;
  }
  if (ca && rr && rr->result.output_throughput > 0 && rr->result.ttft_ms.p50 > 0) {
    const double speedup = ca->result.output_throughput / rr->result.output_throughput;
    const double ttft_cut = 1 - ca->result.ttft_ms.p50 / rr->result.ttft_ms.p50;
    const double hit = ca->result.prefix_cache_hit_rate().value_or(0);
    md += "\nGoals (cache_aware against round_robin):\n\n";
    md += fmt::format("- throughput x{:.2f} (goal >= 2): {}\n", speedup, speedup >= 2 ? "met" : "NOT met");
    md += fmt::format("- TTFT p50 {:.0f}% lower (goal >= 70%): {}\n", ttft_cut * 100, ttft_cut >= 0.7 ? "met" : "NOT met");
    md += fmt::format("- hit rate {} vs best achievable {} (goal: within 10%, i.e. >= {}): {}\n", percent(hit),
                      percent(best), percent(best * 0.9), hit >= best * 0.9 ? "met" : "NOT met");
  }
  md += "\nPlots: ![TTFT CDF](ttft_cdf.svg) ![throughput](throughput.svg) ![TTFT](ttft.svg) "
        "![hit rate](hit_rate.svg) ![load](replica_load.svg)\n";
  return md;
}

int run_compare(const CompareOptions& o) {
  fs::create_directories(o.out_dir);
  std::vector<PolicyRun> runs;
  for (const std::string& policy : o.policies) runs.push_back(run_policy(o, policy));
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_path(o.serve));
  WorkloadOptions wo = o.serve.workload;
  wo.seed = o.serve.seed;
  const double best = best_hit_rate(make_workload(wo, PromptBuilder(tokenizer)), tokenizer, o.block_size);
  std::vector<PolicyOutcome> outcomes;
  boost::json::object all{{"best_achievable_hit_rate", best}};
  for (const PolicyRun& r : runs) {
    outcomes.push_back(r.outcome);
    std::ifstream in(fs::path(o.out_dir) / (r.outcome.policy + ".json"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    all[r.outcome.policy] = boost::json::parse(text);
  }
  write_plots(o, runs);
  const std::string md = markdown_report(o, outcomes, best);
  std::ofstream(fs::path(o.out_dir) / "report.md") << md;
  std::ofstream(fs::path(o.out_dir) / "results.json") << boost::json::serialize(all) << "\n";
  std::cout << md;
  return 0;
}

}  // namespace kvfleet::bench
