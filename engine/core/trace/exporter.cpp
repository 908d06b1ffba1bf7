// OTLP/HTTP JSON encoding and the batching background exporter (kvfleet/trace/exporter.h).
#include "kvfleet/trace/exporter.h"

#include <boost/json.hpp>
#include <charconv>
#include <stdexcept>

#include "kvfleet/http/client.h"

namespace kvfleet::trace {
namespace json = boost::json;

OtlpTarget parse_otlp_endpoint(const std::string& endpoint) {
  constexpr std::string_view scheme = "http://";
  const std::string_view e = endpoint;
  if (e.substr(0, scheme.size()) != scheme)
    throw std::invalid_argument("otlp_endpoint must be an http:// URL (got '" + endpoint + "')");
  std::string_view rest = e.substr(scheme.size());
  const std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (path.find_first_of("?#") != std::string_view::npos)
    throw std::invalid_argument("otlp_endpoint takes no query or fragment (got '" + endpoint + "')");
  OtlpTarget t;
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos || authority.substr(close + 1, 1) != ":")
      throw std::invalid_argument("otlp_endpoint needs host:port (got '" + endpoint + "')");
    t.host = std::string(authority.substr(1, close - 1));
    port_text = authority.substr(close + 2);
  } else {
    const std::size_t colon = authority.rfind(':');
    if (colon == std::string_view::npos || colon == 0)
      throw std::invalid_argument("otlp_endpoint needs host:port (got '" + endpoint + "')");
    t.host = std::string(authority.substr(0, colon));
    port_text = authority.substr(colon + 1);
  }
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 || port > 65535)
    throw std::invalid_argument("otlp_endpoint has no valid port 1-65535 (got '" + endpoint + "')");
  t.port = static_cast<std::uint16_t>(port);
  t.path = std::string(path) + "/v1/traces";
  return t;
}

namespace {

json::object any_value(const Attribute& a) {
  return std::visit(
      [](const auto& v) -> json::object {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return {{"stringValue", v}};
        else if constexpr (std::is_same_v<T, std::int64_t>) return {{"intValue", std::to_string(v)}};  // int64: a string
        else if constexpr (std::is_same_v<T, double>) return {{"doubleValue", v}};
        else return {{"boolValue", v}};
      },
      a.value);
}

json::array attributes_json(const std::vector<Attribute>& attributes) {
  json::array out;
  for (const auto& a : attributes) out.push_back(json::object{{"key", a.key}, {"value", any_value(a)}});
  return out;
}

json::object span_json(const Span& s) {
  json::object o{{"traceId", to_hex(s.trace_id)},
                 {"spanId", to_hex(s.span_id)},
                 {"name", s.name},
                 {"kind", static_cast<int>(s.kind)},
                 {"startTimeUnixNano", std::to_string(s.start_ns)},
                 {"endTimeUnixNano", std::to_string(std::max(s.end_ns, s.start_ns))},
                 {"attributes", attributes_json(s.attributes)}};
  if (s.parent) o["parentSpanId"] = to_hex(*s.parent);
  if (!s.events.empty()) {
    json::array events;
    for (const auto& e : s.events)
      events.push_back(json::object{{"timeUnixNano", std::to_string(e.time_ns)}, {"name", e.name}});
    o["events"] = std::move(events);
  }
  if (s.error) o["status"] = json::object{{"code", 2}};
  return o;
}

}  // namespace

std::string encode_otlp_json(const std::vector<Span>& spans, const std::string& service_name) {
  json::array out;
  for (const auto& s : spans) out.push_back(span_json(s));
  const Attribute service{"service.name", service_name};
  json::object resource{{"attributes", attributes_json({service})}};
  json::object scope_spans{{"scope", json::object{{"name", "kvfleet"}}}, {"spans", std::move(out)}};
  json::object resource_spans{{"resource", std::move(resource)}, {"scopeSpans", json::array{std::move(scope_spans)}}};
  return json::serialize(json::object{{"resourceSpans", json::array{std::move(resource_spans)}}});
}

SpanExporter::SpanExporter(ExporterConfig config, http::MetricsRegistry& metrics)
    : config_(std::move(config)),
      target_(parse_otlp_endpoint(config_.endpoint)),
      queue_full_(metrics.counter("kvfleet_otlp_spans_dropped_total", "Spans not delivered to the OTLP collector",
                                  {{"reason", "queue_full"}})),
      export_failed_(metrics.counter("kvfleet_otlp_spans_dropped_total", "Spans not delivered to the OTLP collector",
                                     {{"reason", "export_failed"}})),
      exported_(metrics.counter("kvfleet_otlp_spans_exported_total", "Spans the OTLP collector accepted")) {
  thread_ = std::thread([this] { run(); });
}

SpanExporter::~SpanExporter() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void SpanExporter::export_span(Span span) {
  bool full = false, wake = false;
  {
    std::lock_guard lock(mu_);
    full = queue_.size() >= config_.max_queue_spans;
    if (!full) {
      queue_.push_back(std::move(span));
      wake = queue_.size() >= config_.max_batch_spans;
    }
  }
  if (full) queue_full_.Increment();
  if (wake) wake_.notify_one();
}

void SpanExporter::run() {
  std::vector<Span> batch;
  for (;;) {
    bool last = false;
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, config_.flush_interval,
                     [this] { return stopping_ || queue_.size() >= config_.max_batch_spans; });
      last = stopping_;
      // At shutdown one post of everything buffered; otherwise one batch.
      const std::size_t n = last ? queue_.size() : std::min(queue_.size(), config_.max_batch_spans);
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.begin() + n));
      queue_.erase(queue_.begin(), queue_.begin() + n);
    }
    if (!batch.empty()) post(batch);
    batch.clear();
    if (last) return;
  }
}

void SpanExporter::post(std::vector<Span>& batch) {
  const auto count = static_cast<double>(batch.size());
  try {
    http::Headers headers{{"Content-Type", "application/json"}};
    const http::Response r = http::http_request(target_.host, target_.port, "POST", target_.path,
                                                encode_otlp_json(batch, config_.service_name), std::move(headers),
                                                config_.timeout);
    if (r.status >= 200 && r.status < 300) {
      exported_.Increment(count);
      return;
    }
  } catch (const std::exception&) {
  }
  export_failed_.Increment(count);
}

}  // namespace kvfleet::trace
