// The replica's Prometheus metrics (kvfleet_ prefix, base units, _total counters). Gauges and the engine's
// cumulative counters are refreshed from Engine::stats() at each scrape; latencies are observed as requests
// run. The scrape also carries vLLM's names for the load gauges (vllm_metrics.h). Thread-safe.
#pragma once

#include <mutex>
#include <string>

#include "engine/server/vllm_metrics.h"
#include "kvfleet/engine.h"
#include "kvfleet/http/metrics.h"

namespace kvfleet::server {

class ReplicaMetrics {
 public:
  explicit ReplicaMetrics(std::int32_t block_size, const VllmMetricsInfo& vllm = {});

  void observe_ttft(double seconds) { ttft_->Observe(seconds); }
  void observe_itl(double seconds) { itl_->Observe(seconds); }
  void observe_e2e(double seconds) { e2e_->Observe(seconds); }
  void observe_queue(double seconds) { queue_->Observe(seconds); }
  void count_http(const std::string& path, int status);

  // The text exposition, after pulling the engine's current numbers.
  std::string render(const EngineStats& stats);
  // For metrics other parts add (engine/pd's transfer metrics).
  http::MetricsRegistry& registry() { return registry_; }

 private:
  void update_moe(const MoeLoadStats& now);  // MoE models only; caller holds mu_
  void update_steps(const EngineStats& now);  // caller holds mu_
  void update_tiers(const KvTierStats& now);  // replicas with KV tiers only; caller holds mu_

  http::MetricsRegistry registry_;
  VllmMetrics vllm_;
  prometheus::Gauge *running_, *waiting_, *kv_usage_;
  prometheus::Counter *prefix_queries_, *prefix_hits_, *evicted_tokens_, *preemptions_, *prompt_tokens_, *generation_tokens_;
  prometheus::Counter* finished_[4] = {};
  prometheus::Histogram *ttft_, *itl_, *e2e_, *queue_;
  std::mutex mu_;
  EngineStats last_;  // what the counters already include
  std::int32_t block_size_;
};

}  // namespace kvfleet::server
