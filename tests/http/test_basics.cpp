// The pieces without sockets: error bodies, SSE framing and parsing, headers, metrics text.
#include <doctest/doctest.h>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>

#include "kvfleet/http/json_error.h"
#include "kvfleet/http/metrics.h"
#include "kvfleet/http/sse.h"

using namespace kvfleet::http;

TEST_CASE("json_error writes the OpenAI error object") {
  Response r = json_error(400, "bad \"temperature\"", "invalid_request_error", "temperature");
  CHECK(r.status == 400);
  CHECK(*r.headers.find("content-type") == "application/json");
  CHECK(r.body ==
        R"({"error":{"message":"bad \"temperature\"","type":"invalid_request_error",)"
        R"("param":"temperature","code":null}})");
  Response busy = json_error(503, "draining", error_type_for(503), {}, "draining");
  auto error = boost::json::parse(busy.body).at("error");
  CHECK(error.at("type") == "overloaded_error");
  CHECK(error.at("param").is_null());
  CHECK(error.at("code") == "draining");
  CHECK(error_type_for(404) == "not_found_error");
  CHECK(error_type_for(413) == "request_too_large");
  CHECK(error_type_for(429) == "rate_limit_error");
}

TEST_CASE("json_response serializes any JSON value as an application/json body") {
  const Response r = json_response(201, boost::json::object{{"url", "http://a:1"}, {"slot", 3}});
  CHECK(r.status == 201);
  CHECK(*r.headers.find("content-type") == "application/json");
  CHECK(r.body == R"({"url":"http://a:1","slot":3})");
  CHECK(json_response(200, boost::json::array{1, "x"}).body == R"([1,"x"])");
}

TEST_CASE("headers are case-insensitive; query parameters") {
  Headers h{{"Content-Type", "a"}, {"X-One", "1"}};
  h.set("content-type", "b");
  CHECK(h.fields().size() == 2);
  CHECK(*h.find("CONTENT-TYPE") == "b");
  CHECK(h.find("missing") == nullptr);
  Request r{"GET", "/v1/kv_events?since=42&x", {}, {}};
  CHECK(r.path() == "/v1/kv_events");
  CHECK(r.query_param("since") == "42");
  CHECK(r.query_param("x") == "");
  CHECK(r.query_param("y") == std::nullopt);
}

TEST_CASE("sse_format splits multi-line data") {
  CHECK(sse_format("{\"a\":1}") == "data: {\"a\":1}\n\n");
  CHECK(sse_format("a\nb", "config") == "event: config\ndata: a\ndata: b\n\n");
}

TEST_CASE("SseParser yields the same events however the input is split") {
  std::string stream;
  for (int i = 0; i < 50; ++i) stream += sse_format("event " + std::to_string(i));
  stream += ": keep-alive comment\r\n\r\n";           // a comment alone is no event
  stream += "event: done\r\ndata: x\r\ndata: y\r\nid: 7\r\n\r\n";  // CRLF line ends
  stream += "data: [DONE]\n\n";
  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, stream.size()}) {
    SseParser parser;
    std::vector<SseEvent> events;
    for (size_t at = 0; at < stream.size(); at += piece) {
      for (auto& e : parser.feed(std::string_view(stream).substr(at, piece))) events.push_back(e);
    }
    INFO("piece size " << piece);
    REQUIRE(events.size() == 52);
    for (int i = 0; i < 50; ++i) CHECK(events[size_t(i)].data == "event " + std::to_string(i));
    CHECK(events[50].event == "done");
    CHECK(events[50].data == "x\ny");
    CHECK(events[50].id == "7");
    CHECK(events[51].data == "[DONE]");
    CHECK(parser.pending_bytes() == 0);
  }
}

TEST_CASE("SseParser holds an unfinished event back") {
  SseParser parser;
  CHECK(parser.feed("data: par").empty());
  CHECK(parser.pending_bytes() == 9);
  CHECK(parser.feed("tial\n").empty());
  auto events = parser.feed("\n");
  REQUIRE(events.size() == 1);
  CHECK(events[0].data == "partial");
}

TEST_CASE("MetricsRegistry renders counters, gauges and histograms in text format") {
  MetricsRegistry metrics;
  auto& requests = metrics.counter("kvfleet_requests_total", "Requests served.", {{"code", "200"}});
  requests.Increment(3);
  // Registering the same name again reaches the same family.
  metrics.counter("kvfleet_requests_total", "Requests served.", {{"code", "200"}}).Increment();
  metrics.gauge("kvfleet_running_requests", "Requests running now.").Set(2);
  auto& latency = metrics.histogram("kvfleet_request_duration_seconds", "Request latency.", {0.1, 1.0});
  latency.Observe(0.05);
  latency.Observe(0.5);
  latency.Observe(5.0);
  std::string text = metrics.render();
  INFO(text);
  CHECK(text.find("# TYPE kvfleet_requests_total counter\n") != std::string::npos);
  CHECK(text.find("kvfleet_requests_total{code=\"200\"} 4") != std::string::npos);
  CHECK(text.find("kvfleet_running_requests 2") != std::string::npos);
  CHECK(text.find("# TYPE kvfleet_request_duration_seconds histogram\n") != std::string::npos);
  CHECK(text.find("kvfleet_request_duration_seconds_bucket{le=\"0.1\"} 1") != std::string::npos);
  CHECK(text.find("kvfleet_request_duration_seconds_bucket{le=\"1\"} 2") != std::string::npos);
  CHECK(text.find("kvfleet_request_duration_seconds_bucket{le=\"+Inf\"} 3") != std::string::npos);
  CHECK(text.find("kvfleet_request_duration_seconds_count 3") != std::string::npos);
  CHECK(text.find("kvfleet_request_duration_seconds_sum 5.55") != std::string::npos);
  CHECK(*metrics.response().headers.find("Content-Type") == "text/plain; version=0.0.4; charset=utf-8");
}

TEST_CASE("MetricsRegistry rejects names that break the conventions") {
  MetricsRegistry metrics;
  CHECK_THROWS_AS(metrics.counter("requests_total", "no prefix"), std::invalid_argument);
  CHECK_THROWS_AS(metrics.counter("kvfleet_requests", "counter without _total"), std::invalid_argument);
  CHECK_THROWS_AS(metrics.gauge("kvfleet_things_total", "gauge with _total"), std::invalid_argument);
}
