#include "bench/kvfleet_bench/result.h"

#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fmt/format.h>
#include <stdexcept>

namespace kvfleet::bench {
namespace {

namespace json = boost::json;

// Per request TPOT as vllm defines it: decode time over the tokens after the first.
std::optional<double> tpot_of(const RequestResult& r) {
  if (r.output_tokens <= 1) return std::nullopt;
  return (r.latency - r.ttft) / static_cast<double>(r.output_tokens - 1);
}

bool meets(const RequestResult& r, const Goodput& g) {
  if (g.ttft_ms && r.ttft * 1000 > *g.ttft_ms) return false;
  if (g.e2el_ms && r.latency * 1000 > *g.e2el_ms) return false;
  if (g.tpot_ms) {
    const auto tpot = tpot_of(r);
    if (tpot && *tpot * 1000 > *g.tpot_ms) return false;
  }
  return true;
}

std::vector<double> in_ms(std::vector<double> seconds) {
  for (double& v : seconds) v *= 1000;
  return seconds;
}

void put_summary(json::object& o, const char* metric, const Summary& s) {
  const std::string m = metric;
  o["mean_" + m + "_ms"] = s.mean;
  o["median_" + m + "_ms"] = s.median;
  o["std_" + m + "_ms"] = s.std;
  o["p50_" + m + "_ms"] = s.p50;
  o["p90_" + m + "_ms"] = s.p90;
  o["p99_" + m + "_ms"] = s.p99;
}

// Digit runs as '#': messages that differ only in their numbers are one kind of failure.
std::string message_key(const std::string& kind, const std::string& message) {
  std::string key = kind + ":";
  for (std::size_t i = 0; i < message.size(); ++i) {
    if (message[i] >= '0' && message[i] <= '9') {
      if (key.back() != '#') key += '#';
    } else {
      key += message[i];
    }
  }
  return key;
}

void add_error_sample(std::vector<ErrorSample>& samples, std::map<std::string, std::size_t>& index,
                      const RequestResult& r) {
  const std::string message = error_message(r);
  const std::string key = message_key(r.error_kind, message);
  if (auto it = index.find(key); it != index.end()) {
    ++samples[it->second].count;
  } else if (samples.size() < kMaxErrorSamples) {
    index.emplace(key, samples.size());
    samples.push_back(ErrorSample{r.error_kind, message, 1});
  }
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::gmtime(&now));
  return buf;
}

}  // namespace

Goodput parse_goodput(const std::vector<std::string>& items) {
  Goodput g;
  for (const std::string& item : items) {
    const auto colon = item.find(':');
    const std::string key = item.substr(0, colon);
    double value = -1;
    try {
      if (colon != std::string::npos) value = std::stod(item.substr(colon + 1));
    } catch (const std::exception&) {
    }
    if (!(value >= 0)) throw std::invalid_argument("--goodput wants KEY:MS with MS >= 0, got '" + item + "'");
    if (key == "ttft") g.ttft_ms = value;
    else if (key == "tpot") g.tpot_ms = value;
    else if (key == "e2el") g.e2el_ms = value;
    else throw std::invalid_argument("--goodput keys are ttft, tpot and e2el, got '" + key + "'");
  }
  return g;
}

std::optional<double> BenchResult::prefix_cache_hit_rate() const {
  if (!fleet || fleet->prefix_queries <= 0) return std::nullopt;
  return fleet->prefix_hits / fleet->prefix_queries;
}

std::optional<double> BenchResult::prompt_hit_ratio() const {
  if (cached_reported == 0 || total_input_tokens <= 0) return std::nullopt;
  return static_cast<double>(total_cached_tokens) / static_cast<double>(total_input_tokens);
}

std::string error_message(const RequestResult& r) {
  boost::system::error_code ec;
  const json::value v = json::parse(r.error, ec);
  if (!ec && v.is_object()) {
    if (const auto* e = v.as_object().if_contains("error")) {
      if (e->is_string()) return std::string(e->as_string());
      if (e->is_object())
        if (const auto* m = e->as_object().if_contains("message"); m && m->is_string()) return std::string(m->as_string());
    }
  }
  return r.error;
}

BenchResult compute_result(const RunOutput& run, const Goodput& goodput) {
  BenchResult b;
  std::vector<double> ttft, tpot, itl, e2el;
  std::size_t good = 0;
  std::map<std::string, std::size_t> sample_index;
  for (const RequestResult& r : run.results) {
    if (!r.success) {
      ++b.failed;
      ++b.errors[r.error_kind];
      add_error_sample(b.error_samples, sample_index, r);
      continue;
    }
    ++b.completed;
    b.total_input_tokens += std::max<std::int64_t>(0, r.prompt_tokens);
    b.total_output_tokens += r.output_tokens;
    if (r.cached_tokens >= 0) {
      b.total_cached_tokens += r.cached_tokens;
      ++b.cached_reported;
    }
    ttft.push_back(r.ttft);
    e2el.push_back(r.latency);
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    if (auto t = tpot_of(r)) tpot.push_back(*t);
    if (!r.replica.empty()) ++b.per_replica[r.replica];
    if (goodput.any() && meets(r, goodput)) ++good;
  }
  b.duration = run.duration;
  if (b.duration > 0) {
    b.request_throughput = static_cast<double>(b.completed) / b.duration;
    b.request_goodput = static_cast<double>(good) / b.duration;
    b.output_throughput = static_cast<double>(b.total_output_tokens) / b.duration;
    b.total_token_throughput = static_cast<double>(b.total_input_tokens + b.total_output_tokens) / b.duration;
  }
  b.ttft_ms = summarize(in_ms(ttft));
  b.tpot_ms = summarize(in_ms(tpot));
  b.itl_ms = summarize(in_ms(itl));
  b.e2el_ms = summarize(in_ms(e2el));
  for (double v : output_tokens_per_second(run)) b.max_output_tokens_per_s = std::max(b.max_output_tokens_per_s, v);
  b.max_concurrent_requests = run.max_in_flight;
  return b;
}

std::vector<double> output_tokens_per_second(const RunOutput& run) {
  std::vector<double> buckets(static_cast<std::size_t>(std::ceil(std::max(run.duration, 0.0))) + 1, 0.0);
  for (const RequestResult& r : run.results) {
    if (!r.success) continue;
    const double per_chunk = static_cast<double>(r.output_tokens) / static_cast<double>(r.itl.size() + 1);
    double t = r.start + r.ttft;
    auto add = [&](double at) {
      const auto i = std::min(buckets.size() - 1, static_cast<std::size_t>(std::max(0.0, at)));
      buckets[i] += per_chunk;
    };
    add(t);
    for (double gap : r.itl) add(t += gap);
  }
  return buckets;
}

json::object result_json(const BenchResult& b, const RunInfo& info, const RunOutput& run, bool detailed) {
  json::object o;
  o["date"] = today();
  o["backend"] = "openai";
  o["model_id"] = info.model;
  o["base_url"] = info.base_url;
  o["endpoint"] = info.endpoint;
  o["dataset_name"] = info.dataset;
  o["num_prompts"] = info.num_prompts;
  o["request_rate"] = std::isinf(info.request_rate) ? json::value("inf") : json::value(info.request_rate);
  o["burstiness"] = info.burstiness;
  o["max_concurrency"] = info.max_concurrency == 0 ? json::value(nullptr) : json::value(info.max_concurrency);
  o["seed"] = info.seed;
  o["duration"] = b.duration;
  o["completed"] = b.completed;
  o["failed"] = b.failed;
  o["total_input_tokens"] = b.total_input_tokens;
  o["total_output_tokens"] = b.total_output_tokens;
  o["request_throughput"] = b.request_throughput;
  o["request_goodput"] = b.request_goodput;
  o["output_throughput"] = b.output_throughput;
  o["total_token_throughput"] = b.total_token_throughput;
  o["max_output_tokens_per_s"] = b.max_output_tokens_per_s;
  o["max_concurrent_requests"] = b.max_concurrent_requests;
  put_summary(o, "ttft", b.ttft_ms);
  put_summary(o, "tpot", b.tpot_ms);
  put_summary(o, "itl", b.itl_ms);
  put_summary(o, "e2el", b.e2el_ms);
  json::object errors;
  for (const auto& [kind, n] : b.errors) errors[kind] = n;
  o["errors_by_kind"] = std::move(errors);
  json::array samples;
  for (const ErrorSample& e : b.error_samples)
    samples.push_back(json::object{{"kind", e.kind}, {"message", e.message}, {"count", e.count}});
  o["error_messages"] = std::move(samples);
  json::object replicas;
  for (const auto& [url, n] : b.per_replica) replicas[url] = n;
  o["per_replica_requests"] = std::move(replicas);
  const auto rate = b.prefix_cache_hit_rate();
  o["prefix_cache_hit_rate"] = rate ? json::value(*rate) : json::value(nullptr);
  o["preemptions"] = b.fleet ? json::value(b.fleet->preemptions) : json::value(nullptr);
  o["total_cached_tokens"] = b.total_cached_tokens;
  const auto hit = b.prompt_hit_ratio();
  o["prefix_hit_ratio"] = hit ? json::value(*hit) : json::value(nullptr);
  o["infinite_cache_hit_ratio"] = b.infinite_cache_hit_ratio ? json::value(*b.infinite_cache_hit_ratio) : json::value(nullptr);
  if (b.fleet)
    o["kv_tier_hit_tokens"] = json::object{{"host", b.fleet->tier_hits_host}, {"disk", b.fleet->tier_hits_disk},
                                           {"shared", b.fleet->tier_hits_shared}};
  if (detailed) {
    json::array input_lens, output_lens, ttfts, itls, texts, errors_list, replica_list, groups;
    for (const RequestResult& r : run.results) {
      input_lens.push_back(r.prompt_tokens);
      output_lens.push_back(r.output_tokens);
      ttfts.push_back(r.ttft);
      json::array gaps(r.itl.begin(), r.itl.end());
      itls.push_back(std::move(gaps));
      texts.push_back(json::string(r.text));
      errors_list.push_back(json::string(r.success ? "" : r.error_kind + ": " + r.error));
      replica_list.push_back(json::string(r.replica));
      groups.push_back(r.group);
    }
    o["input_lens"] = std::move(input_lens);
    o["output_lens"] = std::move(output_lens);
    o["ttfts"] = std::move(ttfts);
    o["itls"] = std::move(itls);
    o["generated_texts"] = std::move(texts);
    o["errors"] = std::move(errors_list);
    o["replicas"] = std::move(replica_list);
    o["groups"] = std::move(groups);
  }
  return o;
}

void print_result(std::ostream& out, const BenchResult& b) {
  auto line = [&](const std::string& name, const std::string& value) { out << fmt::format("{:<40}{:<10}\n", name, value); };
  auto num = [](double v) { return fmt::format("{:.2f}", v); };
  out << fmt::format("{:=^50}\n", " Serving Benchmark Result ");
  line("Successful requests:", std::to_string(b.completed));
  line("Failed requests:", std::to_string(b.failed));
  line("Benchmark duration (s):", num(b.duration));
  line("Total input tokens:", std::to_string(b.total_input_tokens));
  line("Total generated tokens:", std::to_string(b.total_output_tokens));
  line("Request throughput (req/s):", num(b.request_throughput));
  line("Request goodput (req/s):", num(b.request_goodput));
  line("Output token throughput (tok/s):", num(b.output_throughput));
  line("Total Token throughput (tok/s):", num(b.total_token_throughput));
  auto section = [&](const char* title, const char* key, const Summary& s) {
    out << fmt::format("{:-^50}\n", std::string(" ") + title + " ");
    line(fmt::format("Mean {} (ms):", key), num(s.mean));
    line(fmt::format("Median {} (ms):", key), num(s.median));
    line(fmt::format("P90 {} (ms):", key), num(s.p90));
    line(fmt::format("P99 {} (ms):", key), num(s.p99));
  };
  section("Time to First Token", "TTFT", b.ttft_ms);
  section("Time per Output Token (excl. 1st token)", "TPOT", b.tpot_ms);
  section("Inter-token Latency", "ITL", b.itl_ms);
  section("End-to-end Latency", "E2EL", b.e2el_ms);
  if (b.prompt_hit_ratio() || b.infinite_cache_hit_ratio) {
    out << fmt::format("{:-^50}\n", " Prefix reuse ");
    if (auto hit = b.prompt_hit_ratio()) line("Prefix hit ratio (cached_tokens):", fmt::format("{:.3f}", *hit));
    if (b.infinite_cache_hit_ratio) line("Infinite-cache hit ratio:", fmt::format("{:.3f}", *b.infinite_cache_hit_ratio));
  }
  if (auto rate = b.prefix_cache_hit_rate()) {
    out << fmt::format("{:-^50}\n", " Fleet ");
    line("Prefix cache hit rate:", fmt::format("{:.1f}%", *rate * 100));
    line("Preemptions:", fmt::format("{:.0f}", b.fleet->preemptions));
    const FleetCounters& f = *b.fleet;
    if (f.tier_hits_host + f.tier_hits_disk + f.tier_hits_shared > 0)
      line("KV tier hit tokens (host/disk/shared):",
           fmt::format("{:.0f}/{:.0f}/{:.0f}", f.tier_hits_host, f.tier_hits_disk, f.tier_hits_shared));
  }
  for (const auto& [kind, n] : b.errors) line("Errors (" + kind + "):", std::to_string(n));
  if (!b.error_samples.empty()) {
    out << fmt::format("{:-^50}\n", " First distinct errors ");
    for (const ErrorSample& e : b.error_samples) out << fmt::format("{} x {}: {}\n", e.count, e.kind, e.message);
  }
  for (const auto& [url, n] : b.per_replica) line("Requests on " + url + ":", std::to_string(n));
  out << std::string(50, '=') << "\n";
}

}  // namespace kvfleet::bench
