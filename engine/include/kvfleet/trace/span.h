// Distributed tracing: W3C Trace Context (https://www.w3.org/TR/trace-context/) and spans in the shape
// OpenTelemetry exports them. The router and the replica share it (kvfleet_core).
//
// Propagation contract: a request carries `traceparent: 00-<trace id>-<parent span id>-<flags>` (32 and
// 16 lowercase hex digits, flags 2 hex digits) and optionally `tracestate`, which is passed on as it came.
// A traceparent that breaks the W3C rules (wrong length, uppercase or non-hex digits, an all-zero id,
// version ff, a version 00 header with trailing data) is ignored: the request starts a new trace, and is
// never refused for it. Each hop sends its own span's id as the next parent.
//
// Threading: the functions are thread-safe; a Span is a plain value owned by one thread at a time.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvfleet::trace {

using TraceId = std::array<std::uint8_t, 16>;
using SpanId = std::array<std::uint8_t, 8>;

// Where a span sits: its trace, and (for a context read from a request) the caller's span.
struct SpanContext {
  TraceId trace_id{};
  SpanId span_id{};
  std::uint8_t flags = 1;  // sampled
  std::string state;       // tracestate, passed on unchanged
};

// OTLP's SpanKind enum values.
enum class SpanKind : int { internal = 1, server = 2, client = 3 };

struct Attribute {
  std::string key;
  std::variant<std::string, std::int64_t, double, bool> value;
};

struct Event {
  std::string name;
  std::uint64_t time_ns = 0;  // unix nanoseconds
};

struct Span {
  TraceId trace_id{};
  SpanId span_id{};
  std::optional<SpanId> parent;  // none: the trace's root
  std::string name;
  SpanKind kind = SpanKind::internal;
  std::uint64_t start_ns = 0, end_ns = 0;  // unix nanoseconds
  std::vector<Attribute> attributes;
  std::vector<Event> events;
  bool error = false;  // OTLP status code 2 (error); otherwise unset

  // This span's context (the one its children and the next hop name as their parent).
  SpanContext context(std::string state = {}) const { return {trace_id, span_id, 1, std::move(state)}; }
  // An attribute; setting a key again replaces its value (OTLP keys are unique within a span).
  void set(std::string key, std::string value) { put({std::move(key), std::move(value)}); }
  void set(std::string key, const char* value) { put({std::move(key), std::string(value)}); }
  void set(std::string key, std::int64_t value) { put({std::move(key), value}); }
  void set(std::string key, double value) { put({std::move(key), value}); }
  void set(std::string key, bool value) { put({std::move(key), value}); }

 private:
  void put(Attribute a) {
    for (Attribute& have : attributes)
      if (have.key == a.key) {
        have.value = std::move(a.value);
        return;
      }
    attributes.push_back(std::move(a));
  }
};

std::uint64_t unix_nanos_now();
TraceId new_trace_id();  // random, never all zero
SpanId new_span_id();    // random, never all zero

// The parent context of an incoming request: nullopt when `traceparent` is absent or malformed.
// `tracestate` (may be null) is kept only when the traceparent is valid.
std::optional<SpanContext> parse_traceparent(const std::string* traceparent, const std::string* tracestate);
std::string format_traceparent(const SpanContext& context);

// A new span under `parent` (nullopt: the root of a new trace), started now.
Span start_span(const std::optional<SpanContext>& parent, std::string name, SpanKind kind);
// A new span under the span `parent`, started now.
Span child_span(const Span& parent, std::string name, SpanKind kind = SpanKind::internal);

std::string to_hex(const TraceId& id);
std::string to_hex(const SpanId& id);

}  // namespace kvfleet::trace
