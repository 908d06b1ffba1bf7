#include "engine/server/vllm_metrics.h"

#include <prometheus/text_serializer.h>
#include <sstream>

namespace kvfleet::server {
namespace {

prometheus::Gauge& gauge(prometheus::Registry& r, const std::string& name, const std::string& help,
                         const prometheus::Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

}  // namespace

VllmMetrics::VllmMetrics(std::int32_t block_size, const VllmMetricsInfo& info) : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  const prometheus::Labels labels{{"model_name", info.model_name}, {"engine", "0"}};
  // vLLM's help texts, so that the scrape reads the same as vLLM's.
  running_ = &gauge(r, "vllm:num_requests_running", "Number of requests in model execution batches.", labels);
  waiting_ = &gauge(r, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels);
  kv_usage_ = &gauge(r, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels);
  // An info metric as vLLM writes it: a gauge fixed at 1 whose labels carry the cache configuration (the
  // endpoint picker reads block_size and num_gpu_blocks from it).
  gauge(r, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
        {{"engine", "0"},
         {"block_size", std::to_string(block_size)},
         {"num_gpu_blocks", std::to_string(info.num_blocks)},
         {"enable_prefix_caching", info.enable_prefix_caching ? "True" : "False"}})
      .Set(1);
}

void VllmMetrics::update(const EngineStats& s) {
  running_->Set(s.scheduler.num_running);
  waiting_->Set(s.scheduler.num_waiting);
  kv_usage_->Set(s.scheduler.kv.usage);
}

std::string VllmMetrics::render() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace kvfleet::server
