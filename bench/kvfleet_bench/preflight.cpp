#include "bench/kvfleet_bench/preflight.h"

#include <boost/json.hpp>
#include <stdexcept>

#include "bench/kvfleet_bench/client.h"
#include "kvfleet/http/client.h"

namespace kvfleet::bench {
namespace {

namespace json = boost::json;

std::optional<std::int64_t> max_len_of(const json::value& entry) {
  const auto* o = entry.if_object();
  if (!o) return std::nullopt;
  const auto* v = o->if_contains("max_model_len");
  if (!v || !(v->is_int64() || v->is_uint64()) || v->to_number<std::int64_t>() <= 0) return std::nullopt;
  return v->to_number<std::int64_t>();
}

// What to change, in the dataset's own flags.
std::string advice(const WorkloadOptions& o) {
  if (o.dataset == "shared-prefix")
    return "lower --shared-prefix-system-prompt-len (" + std::to_string(o.system_prompt_len) +
           "), --shared-prefix-question-len (" + std::to_string(o.question_len) + ") or --shared-prefix-output-len (" +
           std::to_string(o.output_len) + ")";
  if (o.dataset == "multi-turn")
    return "lower --turns (" + std::to_string(o.turns) + "), --random-input-len (" + std::to_string(o.random_input_len) +
           "), --random-output-len (" + std::to_string(o.random_output_len) + ") or --system-prompt-len (" +
           std::to_string(o.system_prompt_len) + ")";
  if (o.dataset == "trace")
    return "lower --trace-block-tokens (" + std::to_string(o.trace_block_tokens) + ", Mooncake traces) or --trace-max-output (" +
           std::to_string(o.trace_max_output) + "), or shorten the trace's longest lines";
  return "lower --random-input-len (" + std::to_string(o.random_input_len) + "), --random-output-len (" +
         std::to_string(o.random_output_len) + ") or --random-range-ratio (" + std::to_string(o.random_range_ratio) + ")";
}

}  // namespace

std::optional<std::int64_t> fetch_max_model_len(const std::string& base_url, const std::string& model, std::string* why) {
  auto say = [&](const std::string& s) -> std::optional<std::int64_t> {
    if (why) *why = s;
    return std::nullopt;
  };
  const Target t = parse_target(base_url, "/v1/models");
  http::Response r;
  try {
    r = http::http_request(t.host, t.port, "GET", t.path);
  } catch (const std::exception& e) {
    return say("GET " + base_url + "/v1/models failed: " + e.what());
  }
  if (r.status != 200) return say("GET " + base_url + "/v1/models answered HTTP " + std::to_string(r.status));
  boost::system::error_code ec;
  const json::value v = json::parse(r.body, ec);
  const json::value* data = (!ec && v.is_object()) ? v.as_object().if_contains("data") : nullptr;
  if (!data || !data->is_array() || data->as_array().empty())
    return say(base_url + "/v1/models lists no models");
  const json::array& models = data->as_array();
  for (const json::value& m : models) {
    const auto* o = m.if_object();
    const auto* id = o ? o->if_contains("id") : nullptr;
    if (id && id->is_string() && id->as_string() == model) {
      if (auto n = max_len_of(m)) return n;
      return say(base_url + "/v1/models reports no max_model_len for " + model);
    }
  }
  if (auto n = max_len_of(models.front())) return n;
  return say(base_url + "/v1/models reports no max_model_len");
}

std::optional<std::int64_t> smallest_max_model_len(const std::vector<std::string>& base_urls, const std::string& model) {
  std::optional<std::int64_t> smallest;
  for (std::string url : base_urls) {
    const auto metrics = url.rfind("/metrics");
    if (metrics != std::string::npos && metrics + 8 == url.size()) url.erase(metrics);
    if (auto n = fetch_max_model_len(url, model, nullptr); n && (!smallest || *n < *smallest)) smallest = n;
  }
  return smallest;
}

LongestRequest longest_request(const Workload& w) {
  LongestRequest longest;
  for (std::size_t c = 0; c < w.chains.size(); ++c) {
    const Chain& chain = w.chains[c];
    std::int64_t history = chain.system_tokens;  // a later turn resends the conversation so far
    for (std::size_t i = 0; i < chain.turns.size(); ++i) {
      const Turn& t = chain.turns[i];
      const LongestRequest r{history + t.user_tokens, t.output_len, c, i};
      if (r.total() > longest.total()) longest = r;
      history += t.user_tokens + t.output_len;
    }
  }
  return longest;
}

void check_lengths(const Workload& w, const WorkloadOptions& o, std::int64_t max_model_len) {
  const LongestRequest l = longest_request(w);
  if (l.total() <= max_model_len) return;
  std::string what = "the longest request needs " + std::to_string(l.total()) + " tokens (prompt " +
                     std::to_string(l.prompt_tokens) + " + output " + std::to_string(l.output_tokens);
  what += ") but the server's max_model_len is " + std::to_string(max_model_len) + ", so every such request would fail with 400: " +
          advice(o) + " so that prompt + output fit, or serve a longer context (kvfleet-replica --max-model-len)";
  throw std::invalid_argument(what);
}

}  // namespace kvfleet::bench
