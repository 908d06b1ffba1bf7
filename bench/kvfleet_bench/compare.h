// `kvfleet-bench compare-routing`: for each policy in turn, start a fresh fleet (N replicas + the
// router, so every policy starts with cold caches), run the same workload through the router with the
// replicas' /metrics scraped around it, stop the fleet; then write one report (report.md with the
// table, results.json, per-policy JSON, SVG/PNG plots).
//
// Best achievable hit rate (shared-prefix and trace workloads on /v1/completions): with block size B,
// a group g of P_g prompts whose tokenized prompts share their first L_g tokens can at best miss its
// prefix once (the first request of the group, on the one replica that then holds it) and hit
// floor(L_g / B) * B tokens for every other request, so
//   best = sum_g (P_g - 1) * floor(L_g / B) * B  /  sum over requests of prompt tokens.
// A policy that spreads a group over k replicas pays k misses instead of one; a cache too small to
// keep the group's blocks pays more.
#pragma once

#include <string>
#include <vector>

#include "bench/kvfleet_bench/serve.h"

namespace kvfleet::bench {

struct CompareOptions {
  ServeOptions serve;  // workload, rate, concurrency; base_url and metrics_urls are filled per fleet
  std::string bin_dir;  // default: the folder of this executable
  int replicas = 4;
  std::vector<std::string> policies{"cache_aware", "round_robin", "least_load"};
  std::vector<std::string> replica_flags;  // passed to every replica, e.g. --num-kv-blocks=256
  std::vector<std::string> router_flags;   // passed to the router
  std::int32_t block_size = 16;
  std::string out_dir = "routing-report";
};

struct PolicyOutcome {
  std::string policy;
  BenchResult result;
  double replicas_per_group = 0;  // distinct replicas that served a group, averaged over groups
};

// For grouped workloads: how many distinct replicas served each group, averaged (1 is the ideal).
double replicas_per_group(const RunOutput& run);

void add_compare_flags(CLI::App& app, CompareOptions& options);

// Prompt tokens the best routing would find cached over all prompt tokens (formula above).
double best_hit_rate(const Workload& workload, const Tokenizer& tokenizer, std::int32_t block_size);

// The markdown report: table, goal check (the first policy against round_robin), plot links.
std::string markdown_report(const CompareOptions& options, const std::vector<PolicyOutcome>& outcomes, double best);

int run_compare(const CompareOptions& options);

}  // namespace kvfleet::bench
