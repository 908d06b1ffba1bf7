// `kvfleet-bench compare-tiers`: the same trace against fresh fleets, once per KV tier setup (off: the
// device pool alone; host: --kv-host-gib; disk: --kv-disk-dir with --kv-disk-gib; host+disk) and per
// topology (one replica addressed directly; N replicas behind the router), every run starting with cold
// caches and empty disk directories. The device pool is sized to --device-fraction of the trace's working
// set (the tokens a cache that never evicts would hold), so the tiers below it have something to do.
//
// Report (report.md, results.json, one JSON per run): per run the prefix hit ratio in total and by tier
// (usage.prompt_tokens_details.cached_tokens over prompt tokens; the tiers' share from the replicas'
// kvfleet_kv_tier_hit_tokens_total, the device's the rest), TTFT p50/p90, throughput, and the hit ratio
// an infinite cache would reach on the trace; then each tier setup against `off` on the same topology:
// hit ratio over the infinite cache's, TTFT p50 off / on, throughput on / off. With --repeats N every setup
// runs N times, interleaved (off, host, disk, off, host, ...), and the comparison takes each setup's
// median TTFT p50 and throughput over its runs.
#pragma once

#include <string>
#include <vector>

#include "bench/kvfleet_bench/serve.h"

namespace kvfleet::bench {

struct CompareTiersOptions {
  ServeOptions serve;  // workload (a Mooncake trace), concurrency; base_url and metrics_urls are set per run
  std::string bin_dir;  // default: the folder of this executable
  std::vector<std::string> tiers{"off", "host", "disk"};  // off | host | disk | host+disk
  std::vector<std::string> topologies{"replica", "router"};
  int replicas = 2;  // behind the router
  std::string policy = "cache_aware";
  double device_fraction = 0.10;  // device pool: this share of the working set's blocks
  std::int64_t num_kv_blocks = 0;  // set: the device pool exactly (device_fraction ignored)
  double host_gib = 1.0, disk_gib = 2.0;
  std::vector<std::string> replica_flags, router_flags;
  std::int32_t block_size = 16;
  std::string out_dir = "tiers-report";
  int repeats = 1;  // the whole list of setups this many times, interleaved (a loaded machine drifts)
};

struct TierRun {
  std::string tiers, topology;
  BenchResult result;
  std::int64_t device_blocks = 0;
  int repeat = 0;
};

struct TierShares {  // fractions of all prompt tokens
  double total = 0, device = 0, host = 0, disk = 0, shared = 0;
};
TierShares tier_shares(const BenchResult& result);

// Device blocks for the pool: `fraction` of the working set, at least enough for the longest request
// (prompt + output) twice over so that it never has to be refused.
std::int64_t device_blocks_for(const Workload& workload, double fraction, std::int32_t block_size);

void add_compare_tiers_flags(CLI::App& app, CompareTiersOptions& options);

std::string tiers_markdown(const CompareTiersOptions& options, const std::vector<TierRun>& runs, double working_set_tokens);

int run_compare_tiers(const CompareTiersOptions& options);

}  // namespace kvfleet::bench
