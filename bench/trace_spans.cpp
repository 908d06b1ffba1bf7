// What tracing costs a request on its hot path, and what the exporter's thread spends per batch.
//   build/bin/bench_trace_spans
// BM_router_request_spans: the router's four spans of one request (request, queue_wait, route, upstream: ids,
// attributes, the traceparent sent on) handed to an exporter whose collector is down (its buffer fills and the
// rest are dropped: the hand-over itself is what a request pays). BM_encode_batch: one full batch (512 spans)
// in OTLP JSON, on the exporter's thread.
#include <benchmark/benchmark.h>

#include "kvfleet/trace/exporter.h"

namespace {
using namespace kvfleet;

trace::Span routed_span(const trace::Span& parent, const char* name) {
  trace::Span s = trace::child_span(parent, name);
  s.set("kvfleet.route.replica", "http://10.0.0.7:8000");
  s.set("kvfleet.route.reason", "cache_hit");
  s.set("kvfleet.route.matched_blocks", std::int64_t{42});
  s.end_ns = trace::unix_nanos_now();
  return s;
}

void BM_router_request_spans(benchmark::State& state) {
  http::MetricsRegistry metrics;
  trace::ExporterConfig c;
  c.endpoint = "http://127.0.0.1:9";  // discard port: nothing listens
  c.service_name = "bench";
  trace::SpanExporter exporter(c, metrics);
  const std::string header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  for (auto _ : state) {
    const auto parent = trace::parse_traceparent(&header, nullptr);
    trace::Span request = trace::start_span(parent, "router.request", trace::SpanKind::server);
    request.set("url.path", "/v1/chat/completions");
    exporter.export_span(routed_span(request, "router.queue_wait"));
    exporter.export_span(routed_span(request, "router.route"));
    trace::Span upstream = routed_span(request, "router.upstream");
    benchmark::DoNotOptimize(trace::format_traceparent(upstream.context()));
    exporter.export_span(std::move(upstream));
    request.end_ns = trace::unix_nanos_now();
    exporter.export_span(std::move(request));
  }
}
BENCHMARK(BM_router_request_spans);

void BM_encode_batch(benchmark::State& state) {
  const trace::Span root = trace::start_span(std::nullopt, "router.request", trace::SpanKind::server);
  std::vector<trace::Span> batch(512, routed_span(root, "router.route"));
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string body = trace::encode_otlp_json(batch, "bench");
    bytes = body.size();
    benchmark::DoNotOptimize(body.data());
  }
  state.counters["body_bytes"] = static_cast<double>(bytes);
  state.SetItemsProcessed(state.iterations() * 512);
}
BENCHMARK(BM_encode_batch);

}  // namespace

BENCHMARK_MAIN();
