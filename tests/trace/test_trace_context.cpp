// W3C traceparent parsing, the OTLP JSON encoding (checked by the receiver's strict schema check) and the
// exporter against a real receiver, a dead one and a stuck one (kvfleet/trace/span.h, exporter.h).
#include <doctest/doctest.h>

#include <boost/asio.hpp>
#include <thread>

#include "kvfleet/trace/exporter.h"
#include "otlp_receiver.h"

namespace kvfleet::test {
namespace {

constexpr std::string_view kTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr std::string_view kParent = "00f067aa0ba902b7";

std::optional<trace::SpanContext> parse(const std::string& header, const std::string* state = nullptr) {
  return trace::parse_traceparent(&header, state);
}

// A loopback port nothing listens on.
std::uint16_t closed_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

double dropped(const http::MetricsRegistry& m, const std::string& reason) {
  const std::string text = m.render();
  const std::string key = "kvfleet_otlp_spans_dropped_total{reason=\"" + reason + "\"} ";
  const auto at = text.find(key);
  return at == std::string::npos ? 0 : std::stod(text.substr(at + key.size()));
}

template <class F>
bool eventually(F f, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return f();
}

}  // namespace

TEST_CASE("a valid traceparent gives its trace id and parent; tracestate is kept") {
  const std::string state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
  const auto c = parse("00-" + std::string(kTrace) + "-" + std::string(kParent) + "-01", &state);
  REQUIRE(c);
  CHECK(trace::to_hex(c->trace_id) == kTrace);
  CHECK(trace::to_hex(c->span_id) == kParent);
  CHECK(c->flags == 1);
  CHECK(c->state == state);
  CHECK(trace::format_traceparent(*c) == "00-" + std::string(kTrace) + "-" + std::string(kParent) + "-01");
  // A later version may carry more fields after a dash; its first four are read.
  CHECK(parse("01-" + std::string(kTrace) + "-" + std::string(kParent) + "-00-extra"));
}

TEST_CASE("a malformed traceparent is ignored, and its tracestate with it") {
  const std::string t(kTrace), p(kParent), state = "a=b";
  for (const std::string& bad : std::vector<std::string>{
           "", "00-" + t + "-" + p, "00-" + t + "-" + p + "-01-extra", "ff-" + t + "-" + p + "-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + p + "-01", "00-" + std::string(32, '0') + "-" + p + "-01",
        "00-" + t + "-" + std::string(16, '0') + "-01", "00-" + t + "-" + p + "-0g", "00_" + t + "-" + p + "-01",
        "0-" + t + "-" + p + "-011", "00-" + t.substr(1) + "-" + p + "-011", "01-" + t + "-" + p + "-01x"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse(bad, &state));
  }
  CHECK_FALSE(trace::parse_traceparent(nullptr, &state));
}

TEST_CASE("span ids are random and nonzero; a root span has no parent, a child names its parent") {
  const trace::Span root = trace::start_span(std::nullopt, "root", trace::SpanKind::server);
  CHECK_FALSE(root.parent);
  const trace::Span child = trace::child_span(root, "child");
  CHECK(child.trace_id == root.trace_id);
  REQUIRE(child.parent);
  CHECK(*child.parent == root.span_id);
  CHECK(child.span_id != root.span_id);
  CHECK(trace::new_trace_id() != trace::new_trace_id());
}

TEST_CASE("the OTLP JSON encoding passes the strict schema check, attribute kinds included") {
  trace::Span s = trace::start_span(parse("00-" + std::string(kTrace) + "-" + std::string(kParent) + "-01"), "work",
                                    trace::SpanKind::client);
  s.set("text", "x");
  s.set("count", std::int64_t{-42});
  s.set("ratio", 0.5);
  s.set("flag", true);
  s.events.push_back({"first_token", s.start_ns + 5});
  s.error = true;
  s.end_ns = s.start_ns + 1000;
  const std::string body = trace::encode_otlp_json({s}, "svc");
  std::vector<std::string> errors;
  std::vector<ReceivedSpan> spans;
  otlp_check::request(body, errors, spans);
  CHECK(errors.empty());
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].service == "svc");
  CHECK(spans[0].trace_id == kTrace);
  CHECK(spans[0].parent_span_id == kParent);
  CHECK(spans[0].kind == 3);
  CHECK(spans[0].attributes.at("count") == "-42");
  CHECK(spans[0].attributes.at("flag") == "true");
  CHECK(spans[0].attributes.at("text") == "x");
  CHECK(spans[0].events == std::vector<std::string>{"first_token"});
  CHECK(body.find("\"startTimeUnixNano\":\"" + std::to_string(s.start_ns) + "\"") != std::string::npos);
  // The check itself refuses what OTLP JSON does not allow: an int64 as a JSON number, uppercase ids.
  std::string bad = body;
  bad.replace(bad.find("\"-42\""), 5, "-42");
  errors.clear();
  otlp_check::request(bad, errors, spans);
  CHECK_FALSE(errors.empty());
}

TEST_CASE("endpoints: http://host:port with an optional base path; anything else is refused") {
  const auto t = trace::parse_otlp_endpoint("http://127.0.0.1:4318");
  CHECK(t.host == "127.0.0.1");
  CHECK(t.port == 4318);
  CHECK(t.path == "/v1/traces");
  CHECK(trace::parse_otlp_endpoint("http://collector:4318/otel/").path == "/otel/v1/traces");
  CHECK(trace::parse_otlp_endpoint("http://[::1]:4318").host == "::1");
  for (const char* bad : {"https://c:4318", "c:4318", "http://c", "http://c:0", "http://c:99999", "http://c:43a",
                          "http://c:4318/x?y=1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(trace::parse_otlp_endpoint(bad), std::invalid_argument);
  }
}

TEST_CASE("the exporter posts batches a receiver accepts, by count and by time") {
  OtlpReceiver receiver;
  http::MetricsRegistry metrics;
  trace::ExporterConfig c;
  c.endpoint = receiver.url();
  c.service_name = "unit";
  c.max_batch_spans = 3;
  c.flush_interval = std::chrono::milliseconds(300);
  {
    trace::SpanExporter exporter(c, metrics);
    for (int i = 0; i < 7; ++i) {
      trace::Span s = trace::start_span(std::nullopt, "span", trace::SpanKind::internal);
      s.end_ns = s.start_ns + 1;
      exporter.export_span(std::move(s));
    }
    // Two full batches go at once; the seventh span within the flush interval.
    CHECK(eventually([&] { return receiver.spans().size() == 7; }, std::chrono::seconds(5)));
    CHECK(receiver.posts() == 3);
  }
  CHECK(receiver.errors().empty());
  CHECK(metrics.render().find("kvfleet_otlp_spans_exported_total 7") != std::string::npos);
}

TEST_CASE("a dead collector costs dropped spans, counted; export never waits for it") {
  http::MetricsRegistry metrics;
  trace::ExporterConfig c;
  c.endpoint = "http://127.0.0.1:" + std::to_string(closed_port());
  c.service_name = "unit";
  c.flush_interval = std::chrono::milliseconds(50);
  trace::SpanExporter exporter(c, metrics);
  for (int i = 0; i < 5; ++i) exporter.export_span(trace::start_span(std::nullopt, "s", trace::SpanKind::internal));
  CHECK(eventually([&] { return dropped(metrics, "export_failed") == 5; }));
}

TEST_CASE("a stuck collector fills the bounded buffer: new spans are dropped at once and counted") {
  OtlpReceiver stuck(/*hang=*/true);
  http::MetricsRegistry metrics;
  trace::ExporterConfig c;
  c.endpoint = stuck.url();
  c.service_name = "unit";
  c.max_queue_spans = 10;
  c.max_batch_spans = 2;
  c.timeout = std::chrono::seconds(3);
  trace::SpanExporter exporter(c, metrics);
  exporter.export_span(trace::start_span(std::nullopt, "a", trace::SpanKind::internal));
  exporter.export_span(trace::start_span(std::nullopt, "b", trace::SpanKind::internal));
  REQUIRE(eventually([&] { return stuck.posts() == 1; }));  // the exporter's thread now waits on the collector
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) exporter.export_span(trace::start_span(std::nullopt, "s", trace::SpanKind::internal));
  const auto took = std::chrono::steady_clock::now() - started;
  CHECK(dropped(metrics, "queue_full") == 90);  // 10 buffered, the rest dropped
  CHECK(took < std::chrono::seconds(1));        // (the post it waits on has a 3 s deadline)
  CHECK(eventually([&] { return dropped(metrics, "export_failed") >= 2; }));  // the stuck post's batch, at its deadline
}

}  // namespace kvfleet::test
