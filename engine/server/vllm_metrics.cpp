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
  model_name_ = info.model_name;
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
  update_spec(s.spec);
}

// Registered on the first stats that carry a method (speculation on), so that a replica without it shows none.
void VllmMetrics::update_spec(const SpecDecodeStats& now) {
  if (now.method.empty()) return;
  auto& r = *registry_;
  const prometheus::Labels labels{{"model_name", model_name_}, {"engine", "0"}};
  auto counter = [&](const std::string& name, const std::string& help, const prometheus::Labels& l) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(l);
  };
  if (!spec_drafts_) {
    spec_drafts_ = counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", labels);
    spec_draft_tokens_ = counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", labels);
    spec_accepted_ = counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", labels);
    for (std::size_t p = 0; p < now.accepted_per_pos.size(); ++p) {
      prometheus::Labels l = labels;
      l["position"] = std::to_string(p);
      spec_per_pos_.push_back(counter("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                      "Accepted tokens per draft position.", l));
    }
    last_spec_.accepted_per_pos.assign(now.accepted_per_pos.size(), 0);
  }
  auto advance = [](prometheus::Counter* c, std::uint64_t v, std::uint64_t before) {
    if (v > before) c->Increment(static_cast<double>(v - before));
  };
  advance(spec_drafts_, now.num_drafts, last_spec_.num_drafts);
  advance(spec_draft_tokens_, now.num_draft_tokens, last_spec_.num_draft_tokens);
  advance(spec_accepted_, now.num_accepted_tokens, last_spec_.num_accepted_tokens);
  for (std::size_t p = 0; p < spec_per_pos_.size() && p < now.accepted_per_pos.size(); ++p)
    advance(spec_per_pos_[p], now.accepted_per_pos[p], last_spec_.accepted_per_pos[p]);
  const auto per_pos = last_spec_.accepted_per_pos.size();
  last_spec_ = now;
  last_spec_.accepted_per_pos.resize(per_pos);
}

std::string VllmMetrics::render() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace kvfleet::server
