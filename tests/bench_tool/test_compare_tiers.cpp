// compare-tiers' arithmetic: the hit ratio split by tier, the device pool sized from the trace's working
// set, and the report's rows and ratios against the run with the tiers off.
#include <doctest/doctest.h>

#include "bench/kvfleet_bench/compare_tiers.h"

using namespace kvfleet::bench;

namespace {

BenchResult result(std::int64_t input, std::int64_t cached, double host, double disk, double ttft_p50, double req_s) {
  BenchResult b;
  b.total_input_tokens = input;
  b.total_cached_tokens = cached;
  b.cached_reported = 1;
  b.fleet = FleetCounters{};
  b.fleet->tier_hits_host = host;
  b.fleet->tier_hits_disk = disk;
  b.ttft_ms.p50 = ttft_p50;
  b.ttft_ms.p90 = ttft_p50 * 2;
  b.request_throughput = req_s;
  b.infinite_cache_hit_ratio = 0.8;
  return b;
}

Workload one_request(std::int32_t prompt, std::int32_t output, InfiniteCache cache) {
  Workload w;
  Chain c;
  Turn t;
  t.user_tokens = prompt;
  t.output_len = output;
  c.turns.push_back(t);
  w.chains.push_back(c);
  w.infinite_cache = cache;
  return w;
}

}  // namespace

TEST_CASE("tier shares: host and disk from the replicas' counters, the device the rest of cached_tokens") {
  const TierShares s = tier_shares(result(1000, 700, 300, 100, 10, 1));
  CHECK(s.total == doctest::Approx(0.7));
  CHECK(s.host == doctest::Approx(0.3));
  CHECK(s.disk == doctest::Approx(0.1));
  CHECK(s.device == doctest::Approx(0.3));
  CHECK(tier_shares(BenchResult{}).total == 0);
}

TEST_CASE("the device pool: a share of the working set, never less than the longest request needs") {
  // Working set 10,000 - 2,000 = 8,000 tokens; 10% = 800 tokens = 50 blocks of 16.
  CHECK(device_blocks_for(one_request(100, 10, InfiniteCache{10000, 2000}), 0.10, 16) == 50);
  // A 2,000-token request + 30 out needs 127 blocks, plus one.
  CHECK(device_blocks_for(one_request(2000, 30, InfiniteCache{10000, 2000}), 0.10, 16) == 128);
}

TEST_CASE("the tiers report: one row per run, each tier setup against off on its topology") {
  CompareTiersOptions o;
  o.tiers = {"off", "host"};
  o.topologies = {"replica"};
  const std::vector<TierRun> runs = {TierRun{"off", "replica", result(1000, 100, 0, 0, 300, 2.0), 50, 0},
                                     TierRun{"host", "replica", result(1000, 760, 600, 0, 60, 2.5), 50, 0},
                                     TierRun{"off", "replica", result(1000, 100, 0, 0, 900, 2.0), 50, 1},
                                     TierRun{"host", "replica", result(1000, 760, 600, 0, 20, 2.5), 50, 1},
                                     TierRun{"off", "replica", result(1000, 100, 0, 0, 200, 2.0), 50, 2},
                                     TierRun{"host", "replica", result(1000, 760, 600, 0, 90, 2.5), 50, 2}};
  const std::string md = tiers_markdown(o, runs, 8000);
  CHECK(md.find("| replica | off | 1 | 50 (10%) | 0.100 | 0.100 | 0.000 | 0.000 | 0.800 | 0.12 | 300 | 600 | 2.00 |") !=
        std::string::npos);
  CHECK(md.find("| replica | host | 3 | 50 (10%) | 0.760 | 0.160 | 0.600 | 0.000 | 0.800 | 0.95 | 90 | 180 | 2.50 |") !=
        std::string::npos);
  // Medians: off 300 ms (of 300, 900, 200), host 60 ms (of 60, 20, 90).
  CHECK(md.find("| replica | host | 3 | 0.100 / 0.760 | 300 / 60 | 5.00x | +25.0% | -80.0% |") != std::string::npos);
}
