#include "engine/server/replica_metrics.h"

namespace kvfleet::server {
namespace {

const std::vector<double> kLatencyBuckets{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1.0,   2.5,    5.0,   10.0, 30.0,  60.0, 120.0};

void advance(prometheus::Counter& c, std::uint64_t now, std::uint64_t before) {
  if (now > before) c.Increment(static_cast<double>(now - before));
}

}  // namespace

ReplicaMetrics::ReplicaMetrics(std::int32_t block_size, const VllmMetricsInfo& vllm)
    : vllm_(block_size, vllm), block_size_(block_size) {
  auto& r = registry_;
  running_ = &r.gauge("kvfleet_requests_running", "Requests in the running batch");
  waiting_ = &r.gauge("kvfleet_requests_waiting", "Requests waiting to be scheduled (preempted ones included)");
  kv_usage_ = &r.gauge("kvfleet_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0 to 1)");
  prefix_queries_ = &r.counter("kvfleet_prefix_cache_queries_tokens_total", "Prompt tokens looked up in the prefix cache");
  prefix_hits_ = &r.counter("kvfleet_prefix_cache_hits_tokens_total", "Prompt tokens found in the prefix cache");
  evicted_tokens_ = &r.counter("kvfleet_prefix_cache_evictions_tokens_total",
                               "Cached tokens evicted to make room (whole blocks)");
  preemptions_ = &r.counter("kvfleet_preemptions_total", "Sequences preempted (recomputed later)");
  prompt_tokens_ = &r.counter("kvfleet_prompt_tokens_total", "Prompt tokens computed (cache hits excluded)");
  generation_tokens_ = &r.counter("kvfleet_generation_tokens_total", "Tokens generated");
  const char* reasons[4] = {nullptr, "stop", "length", "abort"};
  for (int i = 1; i < 4; ++i)
    finished_[i] = &r.counter("kvfleet_requests_finished_total", "Requests finished, by finish reason",
                              {{"finish_reason", reasons[i]}});
  ttft_ = &r.histogram("kvfleet_time_to_first_token_seconds", "Time from arrival to the first token", kLatencyBuckets);
  itl_ = &r.histogram("kvfleet_inter_token_latency_seconds", "Time between consecutive tokens of a request", kLatencyBuckets);
  e2e_ = &r.histogram("kvfleet_e2e_request_latency_seconds", "Time from arrival to the last token", kLatencyBuckets);
  queue_ = &r.histogram("kvfleet_request_queue_time_seconds", "Time from arrival to the first scheduled step", kLatencyBuckets);
}

void ReplicaMetrics::count_http(const std::string& path, int status) {
  registry_.counter("kvfleet_http_requests_total", "HTTP requests by path and status",
                    {{"path", path}, {"status", std::to_string(status)}}).Increment();
}

std::string ReplicaMetrics::render(const EngineStats& s) {
  {
    std::lock_guard lock(mu_);
    running_->Set(s.scheduler.num_running);
    waiting_->Set(s.scheduler.num_waiting);
    kv_usage_->Set(s.scheduler.kv.usage);
    advance(*prefix_queries_, s.scheduler.kv.prefix_query_tokens, last_.scheduler.kv.prefix_query_tokens);
    advance(*prefix_hits_, s.scheduler.kv.prefix_hit_tokens, last_.scheduler.kv.prefix_hit_tokens);
    advance(*evicted_tokens_, s.scheduler.kv.evicted_blocks * static_cast<std::uint64_t>(block_size_),
            last_.scheduler.kv.evicted_blocks * static_cast<std::uint64_t>(block_size_));
    advance(*preemptions_, s.scheduler.num_preemptions, last_.scheduler.num_preemptions);
    advance(*prompt_tokens_, s.prompt_tokens, last_.prompt_tokens);
    advance(*generation_tokens_, s.generated_tokens, last_.generated_tokens);
    for (int i = 1; i < 4; ++i) advance(*finished_[i], s.finished[static_cast<std::size_t>(i)], last_.finished[static_cast<std::size_t>(i)]);
    update_moe(s.moe);
    if (!s.spec.method.empty() && s.spec.num_draft_tokens > 0)
      registry_.gauge("kvfleet_spec_decode_acceptance_ratio", "Accepted draft tokens / draft tokens verified, by method",
                      {{"method", s.spec.method}})
          .Set(static_cast<double>(s.spec.num_accepted_tokens) / static_cast<double>(s.spec.num_draft_tokens));
    update_steps(s);
    update_tiers(s.kv_tiers);
    vllm_.update(s);
    last_ = s;
  }
  return registry_.render() + vllm_.render();
}

// The engine's steps and their wall time, all of it and the forward pass within it: the difference is the
// engine's own work per step (schedule, sample, stop checks, outputs). Caller holds mu_.
void ReplicaMetrics::update_steps(const EngineStats& now) {
  advance(registry_.counter("kvfleet_engine_steps_total", "Engine steps that ran a forward pass"), now.steps, last_.steps);
  auto seconds = [](prometheus::Counter& c, double now_s, double before_s) {
    if (now_s > before_s) c.Increment(now_s - before_s);
  };
  seconds(registry_.counter("kvfleet_engine_step_seconds_total", "Wall time of the engine's steps"), now.step_seconds,
          last_.step_seconds);
  seconds(registry_.counter("kvfleet_engine_forward_seconds_total", "Wall time of the forward passes within the steps"),
          now.forward_seconds, last_.forward_seconds);
}

// The KV tiers below the device pool (engine/kvtier), by medium; only on replicas that have some.
// kvfleet_prefix_cache_hits_tokens_total counts every hit, these included (they land in the device pool first).
void ReplicaMetrics::update_tiers(const KvTierStats& now) {
  if (!now.enabled) return;
  const auto seconds = [](prometheus::Counter& c, double now_s, double before_s) {
    if (now_s > before_s) c.Increment(now_s - before_s);
  };
  for (const KvMedium m : {KvMedium::host, KvMedium::disk, KvMedium::shared}) {
    const auto i = static_cast<std::size_t>(m);
    const KvTierMediumStats& s = now.media[i];
    const KvTierMediumStats& b = last_.kv_tiers.media[i];
    const http::MetricLabels medium{{"medium", to_string(m)}};
    advance(registry_.counter("kvfleet_kv_tier_hit_tokens_total", "Prompt tokens found in a KV tier below the device pool",
                              medium),
            s.hit_tokens, b.hit_tokens);
    registry_.gauge("kvfleet_kv_tier_blocks", "KV blocks a tier holds", medium).Set(static_cast<double>(s.blocks));
    registry_.gauge("kvfleet_kv_tier_bytes", "Bytes of the KV blocks a tier holds", medium).Set(static_cast<double>(s.bytes));
    advance(registry_.counter("kvfleet_kv_tier_offload_bytes_total", "Bytes written into a KV tier", medium),
            s.offload_bytes, b.offload_bytes);
    advance(registry_.counter("kvfleet_kv_tier_onload_bytes_total", "Bytes copied from a KV tier into device blocks", medium),
            s.onload_bytes, b.onload_bytes);
    seconds(registry_.counter("kvfleet_kv_tier_offload_seconds_total", "Time spent writing into a KV tier", medium),
            s.offload_seconds, b.offload_seconds);
    seconds(registry_.counter("kvfleet_kv_tier_onload_seconds_total", "Time spent reading a KV tier back", medium),
            s.onload_seconds, b.onload_seconds);
    for (std::size_t e = 0; e < kNumKvTierErrors; ++e)
      advance(registry_.counter("kvfleet_kv_tier_errors_total", "Stored KV blocks not used or not written, by reason",
                                {{"medium", to_string(m)}, {"reason", to_string(static_cast<KvTierError>(e))}}),
              s.errors[e], b.errors[e]);
  }
}

// Created at the first scrape that has MoE numbers, so dense replicas expose none of them.
void ReplicaMetrics::update_moe(const MoeLoadStats& now) {
  if (now.expert_tokens.empty()) return;
  const MoeLoadStats& before = last_.moe;
  for (std::size_t e = 0; e < now.expert_tokens.size(); ++e)
    advance(registry_.counter("kvfleet_moe_expert_tokens_total",
                              "Tokens routed to each expert, summed over the sparse layers", {{"expert", std::to_string(e)}}),
            now.expert_tokens[e], e < before.expert_tokens.size() ? before.expert_tokens[e] : 0);
  registry_.gauge("kvfleet_moe_load_imbalance_ratio",
                  "Last step's max / mean tokens per expert (1: even load)").Set(now.last_imbalance);
  auto& sum = registry_.counter("kvfleet_moe_load_imbalance_ratio_sum_total",
                                "Per-step load imbalance ratios summed over the steps that routed tokens");
  if (now.imbalance_sum > before.imbalance_sum) sum.Increment(now.imbalance_sum - before.imbalance_sum);
  advance(registry_.counter("kvfleet_moe_steps_total", "Steps that routed tokens to experts"), now.steps, before.steps);
}

}  // namespace kvfleet::server
