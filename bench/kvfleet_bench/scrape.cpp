#include "bench/kvfleet_bench/scrape.h"

#include <sstream>
#include <stdexcept>

#include "bench/kvfleet_bench/client.h"
#include "kvfleet/http/client.h"

namespace kvfleet::bench {
namespace {

// "name{labels} value" or "name value"; returns false for comments and other metrics.
bool sample_of(const std::string& line, const std::string& name, double& value) {
  if (line.compare(0, name.size(), name) != 0 || line.size() <= name.size()) return false;
  const char next = line[name.size()];
  if (next != '{' && next != ' ') return false;
  const auto space = line.rfind(' ');
  try {
    value = std::stod(line.substr(space + 1));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The counter of the sample's medium label (host, disk or shared).
double& tier_of(const std::string& line, FleetCounters& c) {
  if (line.find("medium=\"disk\"") != std::string::npos) return c.tier_hits_disk;
  if (line.find("medium=\"shared\"") != std::string::npos) return c.tier_hits_shared;
  return c.tier_hits_host;
}

}  // namespace

FleetCounters parse_metrics_text(const std::string& text) {
  FleetCounters c;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    double v = 0;
    if (sample_of(line, "kvfleet_prefix_cache_queries_tokens_total", v) || sample_of(line, "kvfleet_prefix_cache_queries_total", v))
      c.prefix_queries += v;
    else if (sample_of(line, "kvfleet_prefix_cache_hits_tokens_total", v) || sample_of(line, "kvfleet_prefix_cache_hits_total", v))
      c.prefix_hits += v;
    else if (sample_of(line, "kvfleet_preemptions_total", v))
      c.preemptions += v;
    else if (sample_of(line, "kvfleet_kv_tier_hit_tokens_total", v))
      tier_of(line, c) += v;
  }
  return c;
}

FleetCounters scrape_metrics(const std::string& url) {
  Target t = parse_target(url, "");
  if (t.path.empty()) t.path = "/metrics";
  try {
    const http::Response r = http::http_request(t.host, t.port, "GET", t.path);
    if (r.status != 200) throw std::runtime_error("HTTP " + std::to_string(r.status));
    return parse_metrics_text(r.body);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot scrape " + url + ": " + e.what());
  }
}

FleetCounters counters_delta(const std::vector<FleetCounters>& before, const std::vector<FleetCounters>& after) {
  FleetCounters d;
  for (std::size_t i = 0; i < before.size() && i < after.size(); ++i) {
    d.prefix_queries += after[i].prefix_queries - before[i].prefix_queries;
    d.prefix_hits += after[i].prefix_hits - before[i].prefix_hits;
    d.preemptions += after[i].preemptions - before[i].preemptions;
    d.tier_hits_host += after[i].tier_hits_host - before[i].tier_hits_host;
    d.tier_hits_disk += after[i].tier_hits_disk - before[i].tier_hits_disk;
    d.tier_hits_shared += after[i].tier_hits_shared - before[i].tier_hits_shared;
  }
  return d;
}

}  // namespace kvfleet::bench
