// vLLM's names for the replica's load, so that tools written for vLLM read a kvfleet replica unchanged:
// the Kubernetes Gateway API Inference Extension's endpoint picker (and llm-d, built on it) scrapes
// vllm:num_requests_waiting, vllm:num_requests_running and vllm:kv_cache_usage_perc from every model
// server by default, and vllm:cache_config_info for the block size and the number of KV blocks.
//
// Same values as kvfleet's own gauges (kvfleet_requests_waiting, kvfleet_requests_running,
// kvfleet_kv_cache_usage_ratio; usage is a fraction, 0 to 1, as vLLM's "1 means 100 percent", and counts
// cached blocks no request holds as free, as vLLM's block pool does), set from
// the same EngineStats at each scrape, with vLLM's labels: model_name (the served name) and engine (the
// engine index, "0": a replica runs one engine). Only these few: kvfleet's own names stay the reference.
// With speculative decoding on, vLLM's spec_decode counters too, as vLLM's scrape shows them (its Python
// client adds _total to a counter's name): vllm:spec_decode_num_drafts_total (drafts verified, one per
// speculating sequence and step), vllm:spec_decode_num_draft_tokens_total, vllm:spec_decode_num_accepted_tokens_total
// and vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0".."K-1"}.
//
// They live in a registry of their own because MetricsRegistry admits only kvfleet_ names. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <string>
#include <vector>

#include "kvfleet/engine.h"

namespace kvfleet::server {

struct VllmMetricsInfo {
  std::string model_name;       // the served model name (vLLM's served_model_name)
  std::int32_t num_blocks = 0;  // KV cache size in blocks (vLLM's num_gpu_blocks)
  bool enable_prefix_caching = true;
};

class VllmMetrics {
 public:
  VllmMetrics(std::int32_t block_size, const VllmMetricsInfo& info);

  // Not thread-safe: the caller serialises updates (ReplicaMetrics holds its lock).
  void update(const EngineStats& stats);
  // These metrics in the Prometheus text format, to append to the replica's /metrics.
  std::string render() const;

 private:
  void update_spec(const SpecDecodeStats& now);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge *waiting_, *running_, *kv_usage_;
  std::string model_name_;
  prometheus::Counter *spec_drafts_ = nullptr, *spec_draft_tokens_ = nullptr, *spec_accepted_ = nullptr;
  std::vector<prometheus::Counter*> spec_per_pos_;
  SpecDecodeStats last_spec_;
};

}  // namespace kvfleet::server
