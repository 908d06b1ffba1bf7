// Shared by the tracing tests that run real processes: waiting, posting with a traceparent, and picking
// spans out of what the OTLP receiver got.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "otlp_receiver.h"
#include "router_integration/router_fixture.h"

namespace kvfleet::test {

inline constexpr std::string_view kClientTrace = "0af7651916cd43dd8448eb211c80319c";
inline constexpr std::string_view kClientSpan = "b7ad6b7169203331";

inline std::string client_traceparent() {
  return "00-" + std::string(kClientTrace) + "-" + std::string(kClientSpan) + "-01";
}

template <class F>
bool eventually(F f, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return f();
}

inline http::Response post(std::uint16_t port, const std::string& target, const std::string& body,
                           const std::string& traceparent = "", const std::string& tracestate = "") {
  http::Headers h{{"Content-Type", "application/json"}};
  if (!traceparent.empty()) h.add("traceparent", traceparent);
  if (!tracestate.empty()) h.add("tracestate", tracestate);
  return http::http_request("127.0.0.1", port, "POST", target, body, h, std::chrono::seconds(60));
}

inline std::vector<ReceivedSpan> of_trace(const std::vector<ReceivedSpan>& all, std::string_view trace_id) {
  std::vector<ReceivedSpan> out;
  for (const auto& s : all)
    if (s.trace_id == trace_id) out.push_back(s);
  return out;
}

// The one span named `name` (null: none; two fail the test).
inline const ReceivedSpan* named(const std::vector<ReceivedSpan>& spans, std::string_view name) {
  const ReceivedSpan* found = nullptr;
  for (const auto& s : spans)
    if (s.name == name) {
      REQUIRE_MESSAGE(!found, "two spans named " << name);
      found = &s;
    }
  return found;
}

}  // namespace kvfleet::test
