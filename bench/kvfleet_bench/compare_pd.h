// `kvfleet-bench compare-pd`: the same requests through the same number of replicas, first in
// `pd` mode (prefill replicas compute long prompts, decode replicas pull their KV and decode; the router
// disaggregates when D lacks more than --pd-threshold tokens) and then in `mixed` mode (every replica
// mixed, chunked prefill with the same token budget), each fleet fresh. One report: TTFT, TPOT, ITL p50
// and p99 (over all requests and over the short chat turns alone, the decodes that long prompts stall),
// goodput within the SLOs, KV transfers and fallbacks (decode replicas' kvfleet_pd_* counters) and the
// router's decisions; report.md, results.json, per-mode JSON and SVG (PNG) plots in --out-dir.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/kvfleet_bench/serve.h"

namespace CLI {
class App;
}

namespace kvfleet::bench {

struct ComparePdOptions {
  ServeOptions serve;   // workload (mixed-chat by default), rate, concurrency, goodput SLOs
  std::string bin_dir;  // default: the folder of this executable
  int prefill_replicas = 1, decode_replicas = 1;  // mixed mode runs prefill + decode mixed replicas
  std::uint64_t pd_threshold = 256;
  std::int32_t max_num_batched_tokens = 256;  // every replica's step budget (mixed mode's prefill chunk)
  std::vector<std::string> modes{"pd", "mixed"};
  std::vector<std::string> replica_flags, router_flags;
  std::int32_t block_size = 16;
  std::string out_dir = "pd-report";
};

// What the kvfleet_pd_* and router decision counters said after a run (sums over replicas).
struct PdCounters {
  double transfers = 0, transfer_bytes = 0, fallbacks = 0;
  double disaggregated = 0, below_threshold = 0, no_prefill_replica = 0;
};
// Adds the kvfleet_pd_* samples (summed over labels) of a replica's Prometheus text to `c`.
void add_pd_counters(const std::string& metrics_text, PdCounters& c);
// Adds kvfleet_router_pd_decisions_total{reason} of the router's Prometheus text to `c`.
void add_router_decisions(const std::string& metrics_text, PdCounters& c);

void add_compare_pd_flags(CLI::App& app, ComparePdOptions& options);
int run_compare_pd(const ComparePdOptions& options);

}  // namespace kvfleet::bench
