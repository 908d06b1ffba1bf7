// SpanExporter: sends finished spans to an OpenTelemetry collector over OTLP/HTTP with the JSON encoding
// (POST {endpoint}/v1/traces, Content-Type: application/json; the protobuf messages of
// opentelemetry/proto/collector/trace/v1 in proto3's JSON mapping: lowercase hex ids, 64-bit integers as
// decimal strings, enums as integers).
//
// Contract: export() never blocks and never fails a request. Spans go into a bounded buffer
// (max_queue_spans); a background thread posts them in batches of up to max_batch_spans, as soon as a
// batch is full or every flush_interval. A full buffer drops the new span; a post that fails (no
// collector, a timeout, a non-2xx answer) drops its batch. Either way the spans are counted in
// kvfleet_otlp_spans_dropped_total{reason="queue_full"|"export_failed"}; the ones a collector accepted in
// kvfleet_otlp_spans_exported_total. A slow collector holds up only the background thread (a post's
// connect and each of its reads and writes have a deadline of `timeout`), while new spans past the
// buffer's bound are dropped. The destructor makes one
// last post of what is buffered, then joins the thread.
//
// Threading: export() may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvfleet/http/metrics.h"
#include "kvfleet/trace/span.h"

namespace kvfleet::trace {

struct ExporterConfig {
  std::string endpoint;      // http://host:port[/base path]; spans go to {endpoint}/v1/traces
  std::string service_name;  // the resource's service.name ("kvfleet-router", "kvfleet-replica")
  std::size_t max_queue_spans = 4096;
  std::size_t max_batch_spans = 512;
  std::chrono::milliseconds flush_interval{1'000};
  std::chrono::milliseconds timeout{2'000};  // a post's connect, and each of its reads and writes
};

// The collector's address from an endpoint URL: only http:// (TLS is not implemented); throws
// std::invalid_argument naming what is wrong.
struct OtlpTarget {
  std::string host;
  std::uint16_t port = 0;
  std::string path;  // "/v1/traces" under the endpoint's base path
};
OtlpTarget parse_otlp_endpoint(const std::string& endpoint);

// An ExportTraceServiceRequest in OTLP JSON: one resource (service.name), one scope ("kvfleet"), `spans`.
std::string encode_otlp_json(const std::vector<Span>& spans, const std::string& service_name);

class SpanExporter {
 public:
  // Throws std::invalid_argument for a bad endpoint. `metrics` must outlive the exporter.
  SpanExporter(ExporterConfig config, http::MetricsRegistry& metrics);
  ~SpanExporter();
  SpanExporter(const SpanExporter&) = delete;
  SpanExporter& operator=(const SpanExporter&) = delete;

  void export_span(Span span);

 private:
  void run();
  void post(std::vector<Span>& batch);

  const ExporterConfig config_;
  const OtlpTarget target_;
  prometheus::Counter &queue_full_, &export_failed_, &exported_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Span> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::thread thread_;
};

}  // namespace kvfleet::trace
