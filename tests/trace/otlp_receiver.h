// A test OTLP/HTTP receiver on a loopback port: POST /v1/traces with the JSON encoding, each body checked
// strictly against OTLP's schema (opentelemetry/proto/trace/v1/trace.proto in proto3's JSON mapping) and its
// spans kept. `hang` makes it accept posts and never answer them (a collector that is stuck).
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kvfleet/http/json_error.h"
#include "kvfleet/http/server.h"

namespace kvfleet::test {

// One received span, flattened: the fields the assertions read (attributes as text).
struct ReceivedSpan {
  std::string service, trace_id, span_id, parent_span_id, name;
  std::int64_t kind = 0;
  std::map<std::string, std::string> attributes;  // stringValue / intValue text / "true" / double text
  std::vector<std::string> events;
  std::int64_t status = 0;  // status.code: 0 unset, 1 ok, 2 error
  std::uint64_t start_ns = 0, end_ns = 0;
};

namespace otlp_check {

namespace json = boost::json;

inline bool lower_hex(const json::value* v, std::size_t n) {
  if (!v || !v->is_string() || v->as_string().size() != n) return false;
  bool nonzero = false;
  for (char c : v->as_string()) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    nonzero |= c != '0';
  }
  return nonzero;
}

inline bool decimal(const json::value* v, bool allow_sign = false) {
  if (!v || !v->is_string() || v->as_string().empty()) return false;
  std::string_view s = v->as_string();
  if (allow_sign && s.front() == '-') s.remove_prefix(1);
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

inline void only_keys(const json::object& o, std::initializer_list<std::string_view> allowed, const std::string& where,
                      std::vector<std::string>& errors) {
  for (const auto& kv : o) {
    bool ok = false;
    for (auto a : allowed) ok |= kv.key() == a;
    if (!ok) errors.push_back(where + ": unknown field '" + std::string(kv.key()) + "'");
  }
}

// KeyValue list; each value an AnyValue with exactly one of the scalar kinds kvfleet sends.
inline void attributes(const json::value* v, const std::string& where, std::vector<std::string>& errors,
                       std::map<std::string, std::string>* out) {
  if (!v) return;
  if (!v->is_array()) return errors.push_back(where + ": attributes is not an array");
  for (const auto& a : v->as_array()) {
    if (!a.is_object()) { errors.push_back(where + ": an attribute is not an object"); continue; }
    const auto& o = a.as_object();
    only_keys(o, {"key", "value"}, where + " attribute", errors);
    const json::value* key = o.if_contains("key");
    const json::value* value = o.if_contains("value");
    if (!key || !key->is_string() || key->as_string().empty()) { errors.push_back(where + ": attribute without a key"); continue; }
    const std::string k(key->as_string());
    if (!value || !value->is_object() || value->as_object().size() != 1) {
      errors.push_back(where + ": attribute " + k + " needs a value with exactly one field");
      continue;
    }
    const auto& [kind, x] = *value->as_object().begin();
    std::string text;
    if (kind == "stringValue" && x.is_string()) text = std::string(x.as_string());
    else if (kind == "intValue" && decimal(&x, true)) text = std::string(x.as_string());  // int64: a decimal string
    else if (kind == "doubleValue" && (x.is_double() || x.is_int64() || x.is_uint64())) text = json::serialize(x);
    else if (kind == "boolValue" && x.is_bool()) text = x.as_bool() ? "true" : "false";
    else { errors.push_back(where + ": attribute " + k + " has a bad value " + json::serialize(*value)); continue; }
    if (out) (*out)[k] = text;
  }
}

inline void span(const json::value& v, const std::string& service, std::vector<std::string>& errors,
                 std::vector<ReceivedSpan>& out) {
  if (!v.is_object()) return errors.push_back("a span is not an object");
  const auto& o = v.as_object();
  ReceivedSpan s;
  s.service = service;
  const json::value* name = o.if_contains("name");
  s.name = name && name->is_string() ? std::string(name->as_string()) : "";
  const std::string where = "span " + s.name;
  only_keys(o, {"traceId", "spanId", "parentSpanId", "traceState", "name", "kind", "startTimeUnixNano",
                "endTimeUnixNano", "attributes", "droppedAttributesCount", "events", "droppedEventsCount", "links",
                "droppedLinksCount", "status", "flags"},
            where, errors);
  if (s.name.empty()) errors.push_back("a span without a name");
  if (!lower_hex(o.if_contains("traceId"), 32)) errors.push_back(where + ": traceId is not 32 lowercase hex digits");
  if (!lower_hex(o.if_contains("spanId"), 16)) errors.push_back(where + ": spanId is not 16 lowercase hex digits");
  if (const json::value* p = o.if_contains("parentSpanId"); p && !lower_hex(p, 16))
    errors.push_back(where + ": parentSpanId is not 16 lowercase hex digits");
  const json::value* kind = o.if_contains("kind");
  if (!kind || !kind->is_int64() || kind->as_int64() < 0 || kind->as_int64() > 5)
    errors.push_back(where + ": kind is not an integer SpanKind (0-5)");
  const json::value* start = o.if_contains("startTimeUnixNano");
  const json::value* end = o.if_contains("endTimeUnixNano");
  if (!decimal(start) || !decimal(end)) {
    errors.push_back(where + ": start/endTimeUnixNano are not decimal strings");
  } else {
    const auto a = std::stoull(std::string(start->as_string())), b = std::stoull(std::string(end->as_string()));
    s.start_ns = a;
    s.end_ns = b;
    if (b < a) errors.push_back(where + ": ends before it starts");
    if (a < 1'600'000'000'000'000'000ULL) errors.push_back(where + ": start is not unix nanoseconds");
  }
  attributes(o.if_contains("attributes"), where, errors, &s.attributes);
  if (const json::value* ev = o.if_contains("events")) {
    if (!ev->is_array()) errors.push_back(where + ": events is not an array");
    else
      for (const auto& e : ev->as_array()) {
        if (!e.is_object()) { errors.push_back(where + ": an event is not an object"); continue; }
        only_keys(e.as_object(), {"timeUnixNano", "name", "attributes", "droppedAttributesCount"}, where + " event", errors);
        const json::value* en = e.as_object().if_contains("name");
        if (!decimal(e.as_object().if_contains("timeUnixNano")) || !en || !en->is_string())
          errors.push_back(where + ": an event needs timeUnixNano (decimal string) and name");
        else s.events.push_back(std::string(en->as_string()));
      }
  }
  if (const json::value* st = o.if_contains("status")) {
    const json::value* code = st->is_object() ? st->as_object().if_contains("code") : nullptr;
    if (!code || !code->is_int64() || code->as_int64() < 0 || code->as_int64() > 2)
      errors.push_back(where + ": status.code is not 0-2");
    else s.status = code->as_int64();
  }
  if (o.if_contains("traceId")) s.trace_id = std::string(o.at("traceId").as_string());
  if (o.if_contains("spanId")) s.span_id = std::string(o.at("spanId").as_string());
  if (const json::value* p = o.if_contains("parentSpanId"); p && p->is_string()) s.parent_span_id = std::string(p->as_string());
  if (kind && kind->is_int64()) s.kind = kind->as_int64();
  out.push_back(std::move(s));
}

// An ExportTraceServiceRequest; appends what is wrong to `errors` and the spans to `out`.
inline void request(const std::string& body, std::vector<std::string>& errors, std::vector<ReceivedSpan>& out) {
  json::error_code ec;
  const json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return errors.push_back("the body is not a JSON object");
  only_keys(v.as_object(), {"resourceSpans"}, "request", errors);
  const json::value* rs = v.as_object().if_contains("resourceSpans");
  if (!rs || !rs->is_array() || rs->as_array().empty()) return errors.push_back("no resourceSpans array");
  for (const auto& r : rs->as_array()) {
    if (!r.is_object()) { errors.push_back("a resourceSpans entry is not an object"); continue; }
    only_keys(r.as_object(), {"resource", "scopeSpans", "schemaUrl"}, "resourceSpans", errors);
    std::map<std::string, std::string> resource;
    const json::value* res = r.as_object().if_contains("resource");
    if (!res || !res->is_object()) errors.push_back("resourceSpans without a resource");
    else attributes(res->as_object().if_contains("attributes"), "resource", errors, &resource);
    if (!resource.count("service.name")) errors.push_back("the resource has no service.name");
    const json::value* ss = r.as_object().if_contains("scopeSpans");
    if (!ss || !ss->is_array()) { errors.push_back("resourceSpans without scopeSpans"); continue; }
    for (const auto& scope : ss->as_array()) {
      if (!scope.is_object()) { errors.push_back("a scopeSpans entry is not an object"); continue; }
      only_keys(scope.as_object(), {"scope", "spans", "schemaUrl"}, "scopeSpans", errors);
      const json::value* sc = scope.as_object().if_contains("scope");
      if (sc && (!sc->is_object() || !sc->as_object().if_contains("name") || !sc->as_object().at("name").is_string()))
        errors.push_back("scopeSpans.scope has no name");
      const json::value* spans = scope.as_object().if_contains("spans");
      if (!spans || !spans->is_array()) { errors.push_back("scopeSpans without spans"); continue; }
      for (const auto& s : spans->as_array()) span(s, resource["service.name"], errors, out);
    }
  }
}

}  // namespace otlp_check

class OtlpReceiver {
 public:
  explicit OtlpReceiver(bool hang = false) : hang_(hang) {
    http::HttpServerConfig c;
    c.io_threads = 1;
    http::HttpRouter r;
    r.post("/v1/traces", [this](const http::Request& req, http::ResponseWriter& w) { return receive(req, w); });
    server_ = std::make_unique<http::HttpServer>(c, std::move(r));
    server_->start();
  }
  ~OtlpReceiver() { server_->stop(std::chrono::milliseconds(0)); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  std::vector<ReceivedSpan> spans() const {
    std::lock_guard lock(mu_);
    return spans_;
  }
  std::vector<std::string> errors() const {
    std::lock_guard lock(mu_);
    return errors_;
  }
  int posts() const { return posts_; }

 private:
  boost::asio::awaitable<void> receive(const http::Request& req, http::ResponseWriter& w) {
    ++posts_;
    if (hang_) {
      boost::asio::steady_timer forever(co_await boost::asio::this_coro::executor);
      forever.expires_after(std::chrono::minutes(10));
      co_await forever.async_wait(boost::asio::use_awaitable);
      co_return;
    }
    {
      std::lock_guard lock(mu_);
      const std::string* type = req.headers.find("content-type");
      if (!type || type->rfind("application/json", 0) != 0) errors_.push_back("Content-Type is not application/json");
      otlp_check::request(req.body, errors_, spans_);
    }
    http::Response ok = http::Response::json(200, "{}");  // ExportTraceServiceResponse, all accepted
    co_await w.send(std::move(ok));
  }

  const bool hang_;
  mutable std::mutex mu_;
  std::vector<ReceivedSpan> spans_;
  std::vector<std::string> errors_;
  std::atomic<int> posts_{0};
  std::unique_ptr<http::HttpServer> server_;
};

}  // namespace kvfleet::test
