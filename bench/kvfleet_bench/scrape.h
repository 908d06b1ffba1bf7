// Reads the replica counters the report needs from Prometheus text (GET /metrics): prefix-cache
// query and hit tokens (kvfleet_prefix_cache_{queries,hits}_tokens_total, or the shorter
// kvfleet_prefix_cache_{queries,hits}_total) and kvfleet_preemptions_total, each summed over labels.
#pragma once

#include <string>
#include <vector>

#include "bench/kvfleet_bench/result.h"

namespace kvfleet::bench {

FleetCounters parse_metrics_text(const std::string& text);

// GET `url` (http://HOST:PORT or http://HOST:PORT/metrics); throws std::runtime_error naming the URL.
FleetCounters scrape_metrics(const std::string& url);

// Sum over replicas of after - before.
FleetCounters counters_delta(const std::vector<FleetCounters>& before, const std::vector<FleetCounters>& after);

}  // namespace kvfleet::bench
