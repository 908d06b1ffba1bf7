// kvfleet-bench: `serve` (the load generator, flags as in `vllm bench serve`), `compare-routing`
// (the same workload through a fresh loopback fleet per router policy, one report) and `compare-pd`
// (pd mode against mixed mode with chunked prefill, compare_pd.h) and `compare-tiers` (a trace with the KV
// tiers off and on, compare_tiers.h).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "bench/kvfleet_bench/compare.h"
#include "bench/kvfleet_bench/compare_pd.h"
#include "bench/kvfleet_bench/compare_tiers.h"
#include "bench/kvfleet_bench/serve.h"

int main(int argc, char** argv) {
  CLI::App app{"kvfleet-bench: load generator and routing comparison for OpenAI-compatible servers"};
  app.require_subcommand(1);
  kvfleet::bench::ServeOptions serve;
  CLI::App* serve_cmd = app.add_subcommand("serve", "Benchmark one endpoint (vllm bench serve's flags)");
  kvfleet::bench::add_serve_flags(*serve_cmd, serve);
  kvfleet::bench::CompareOptions compare;
  compare.serve.workload.dataset = "shared-prefix";
  CLI::App* compare_cmd = app.add_subcommand("compare-routing", "Start a fleet per router policy and compare them");
  kvfleet::bench::add_compare_flags(*compare_cmd, compare);
  kvfleet::bench::ComparePdOptions compare_pd;
  compare_pd.serve.workload.dataset = "mixed-chat";
  CLI::App* pd_cmd = app.add_subcommand("compare-pd", "Run the same requests in pd mode and in mixed mode, one report");
  kvfleet::bench::add_compare_pd_flags(*pd_cmd, compare_pd);
  kvfleet::bench::CompareTiersOptions compare_tiers;
  compare_tiers.serve.workload.dataset = "trace";
  CLI::App* tiers_cmd = app.add_subcommand("compare-tiers", "Replay a trace with the KV tiers off and on, one report");
  kvfleet::bench::add_compare_tiers_flags(*tiers_cmd, compare_tiers);
  CLI11_PARSE(app, argc, argv);
  try {
    if (serve_cmd->parsed()) {
      const kvfleet::bench::ServeReport report = kvfleet::bench::run_serve(serve, std::cout);
      return report.result.completed > 0 ? 0 : 1;
    }
    if (pd_cmd->parsed()) return kvfleet::bench::run_compare_pd(compare_pd);
    if (tiers_cmd->parsed()) return kvfleet::bench::run_compare_tiers(compare_tiers);
    return kvfleet::bench::run_compare(compare);
  } catch (const std::exception& e) {
    std::cerr << "kvfleet-bench: " << e.what() << "\n";
    return 2;
  }
}
