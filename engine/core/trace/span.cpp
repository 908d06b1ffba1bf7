// W3C traceparent parsing and formatting, span ids, and span construction (kvfleet/trace/span.h).
#include "kvfleet/trace/span.h"

#include <algorithm>
#include <chrono>
#include <random>

namespace kvfleet::trace {
namespace {

constexpr std::size_t kTraceparentLength = 55;  // 2 + 1 + 32 + 1 + 16 + 1 + 2
constexpr std::size_t kMaxTracestate = 512;     // W3C: a vendor may drop a longer tracestate

int hex_value(char c) {  // lowercase only, as W3C requires
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

template <std::size_t N>
bool parse_hex(std::string_view s, std::array<std::uint8_t, N>& out) {
  if (s.size() != 2 * N) return false;
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return true;
}

template <std::size_t N>
bool all_zero(const std::array<std::uint8_t, N>& id) {
  return std::all_of(id.begin(), id.end(), [](std::uint8_t b) { return b == 0; });
}

template <std::size_t N>
std::string hex_of(const std::array<std::uint8_t, N>& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(2 * N, '0');
  for (std::size_t i = 0; i < N; ++i) {
    s[2 * i] = kDigits[id[i] >> 4];
    s[2 * i + 1] = kDigits[id[i] & 15];
  }
  return s;
}

template <std::size_t N>
std::array<std::uint8_t, N> random_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^ (std::uint64_t{std::random_device{}()} << 32)};
  std::array<std::uint8_t, N> id{};
  do {
    for (std::size_t i = 0; i < N; i += 8) {
      const std::uint64_t r = rng();
      for (std::size_t k = 0; k < 8 && i + k < N; ++k) id[i + k] = static_cast<std::uint8_t>(r >> (8 * k));
    }
  } while (all_zero(id));
  return id;
}

bool tracestate_ok(std::string_view s) {
  if (s.size() > kMaxTracestate) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

}  // namespace

std::uint64_t unix_nanos_now() {
  using namespace std::chrono;
  return static_cast<std::uint64_t>(duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count());
}

TraceId new_trace_id() { return random_id<16>(); }
SpanId new_span_id() { return random_id<8>(); }

std::optional<SpanContext> parse_traceparent(const std::string* traceparent, const std::string* tracestate) {
  if (!traceparent) return std::nullopt;
  std::string_view h = *traceparent;
  while (!h.empty() && (h.front() == ' ' || h.front() == '\t')) h.remove_prefix(1);
  while (!h.empty() && (h.back() == ' ' || h.back() == '\t')) h.remove_suffix(1);
  if (h.size() < kTraceparentLength) return std::nullopt;
  std::array<std::uint8_t, 1> version{}, flags{};
  if (!parse_hex(h.substr(0, 2), version) || version[0] == 0xff) return std::nullopt;
  // Version 00 is exactly 55 characters; a later version may append fields after a '-'.
  if (version[0] == 0 ? h.size() != kTraceparentLength : (h.size() > kTraceparentLength && h[kTraceparentLength] != '-'))
    return std::nullopt;
  if (h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  SpanContext c;
  if (!parse_hex(h.substr(3, 32), c.trace_id) || !parse_hex(h.substr(36, 16), c.span_id) ||
      !parse_hex(h.substr(53, 2), flags))
    return std::nullopt;
  if (all_zero(c.trace_id) || all_zero(c.span_id)) return std::nullopt;
  c.flags = flags[0] & 1;  // only the sampled flag is defined; the rest are not passed on
  if (tracestate && tracestate_ok(*tracestate)) c.state = *tracestate;
  return c;
}

std::string format_traceparent(const SpanContext& context) {
  return "00-" + hex_of(context.trace_id) + "-" + hex_of(context.span_id) + (context.flags & 1 ? "-01" : "-00");
}

Span start_span(const std::optional<SpanContext>& parent, std::string name, SpanKind kind) {
  Span s;
  s.trace_id = parent ? parent->trace_id : new_trace_id();
  if (parent) s.parent = parent->span_id;
  s.span_id = new_span_id();
  s.name = std::move(name);
  s.kind = kind;
  s.start_ns = unix_nanos_now();
  return s;
}

Span child_span(const Span& parent, std::string name, SpanKind kind) {
  return start_span(parent.context(), std::move(name), kind);
}

std::string to_hex(const TraceId& id) { return hex_of(id); }
std::string to_hex(const SpanId& id) { return hex_of(id); }

}  // namespace kvfleet::trace
