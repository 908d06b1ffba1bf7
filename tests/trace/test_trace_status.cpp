// The router's spans carry the HTTP status: router.upstream the replica's (an error span, by OTel's rule for
// HTTP clients, for 4xx and 5xx and for a try that got no answer or a broken one), router.request the
// client's (an error for 5xx, and for an answer that began and then ended in an error event). The replica is a
// scripted stand-in, which answers 400, 500 or breaks its stream on cue.
#include <doctest/doctest.h>

#include "router_integration/hardening_support.h"
#include "trace_support.h"

namespace kvfleet::test {
namespace {

using hardening::config_event;
using hardening::kBody;
using hardening::kStreamBody;
using hardening::standin_flags;

// The router spans of the one trace in `receiver` that the client started (`client_traceparent()`).
std::vector<ReceivedSpan> client_spans(const OtlpReceiver& receiver, std::size_t want) {
  std::vector<ReceivedSpan> spans;
  REQUIRE(eventually([&] {
    spans = of_trace(receiver.spans(), kClientTrace);
    return spans.size() >= want;
  }));
  return spans;
}

}  // namespace

TEST_CASE("router spans: the replica's status on router.upstream, the client's on router.request, errors by OTel's rules") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  struct Case {
    int status;
    std::int64_t upstream_error, request_error;  // OTLP status codes: 2 error, 0 unset
  };
  for (const Case c : {Case{200, 0, 0}, Case{400, 2, 0}, Case{500, 2, 2}}) {
    CAPTURE(c.status);
    OtlpReceiver fresh;
    RouterProcess router({}, standin_flags({&up}, {"--otlp-endpoint", fresh.url(), "--max-attempts", "1"}));
    up.status = c.status;
    REQUIRE(post(router.port(), "/v1/completions", kBody, client_traceparent()).status == c.status);
    // router: request, queue_wait, route, upstream
    const auto spans = client_spans(fresh, 4);
    const ReceivedSpan* request = named(spans, "router.request");
    const ReceivedSpan* upstream = named(spans, "router.upstream");
    REQUIRE(request);
    REQUIRE(upstream);
    const std::string code = std::to_string(c.status);
    CHECK(upstream->attributes.at("http.response.status_code") == code);
    CHECK(request->attributes.at("http.response.status_code") == code);
    CHECK(upstream->status == c.upstream_error);
    CHECK(request->status == c.request_error);
    if (c.upstream_error) CHECK(upstream->attributes.at("error.type") == code);
    else CHECK(upstream->attributes.count("error.type") == 0);
    if (c.request_error) CHECK(request->attributes.at("error.type") == code);
    else CHECK(request->attributes.count("error.type") == 0);
    CHECK(fresh.errors().empty());
  }
}

TEST_CASE("router spans: a stream that breaks after its first events is an error on both spans, with its 200") {
  OtlpReceiver receiver;
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.stream_events = 10;
  up.die_after_events = 2;
  RouterProcess router({}, standin_flags({&up}, {"--otlp-endpoint", receiver.url()}));
  const http::Response r = post(router.port(), "/v1/completions", kStreamBody, client_traceparent());
  REQUIRE(r.status == 200);
  CHECK(r.body.find("\"error\"") != std::string::npos);  // the client's stream ended in an error event
  const auto spans = client_spans(receiver, 4);
  const ReceivedSpan* request = named(spans, "router.request");
  REQUIRE(request);
  CHECK(request->attributes.at("http.response.status_code") == "200");
  CHECK(request->status == 2);
  CHECK(request->attributes.at("error.type") == "response_broken");
  const ReceivedSpan* upstream = named(spans, "router.upstream");  // one try: no other replica to resume on
  REQUIRE(upstream);
  CHECK(upstream->attributes.at("http.response.status_code") == "200");
  CHECK(upstream->status == 2);
  CHECK(upstream->attributes.at("error.type") == "response_broken");
  CHECK(receiver.errors().empty());
}

TEST_CASE("router spans: a replica that answers nothing: no status on its try, 503 to the client, both errors") {
  OtlpReceiver receiver;
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.hang_ms = 5000;  // past the router's upstream deadline
  TempDir dir;
  std::ofstream(dir / "router.yaml") << "upstream_timeout_ms: 300\nmax_attempts: 1\n";
  RouterProcess router({}, standin_flags({&up}, {"--otlp-endpoint", receiver.url(), "--config", (dir / "router.yaml").string()}));
  REQUIRE(post(router.port(), "/v1/completions", kBody, client_traceparent()).status == 503);
  const auto spans = client_spans(receiver, 4);
  const ReceivedSpan* request = named(spans, "router.request");
  const ReceivedSpan* upstream = named(spans, "router.upstream");
  REQUIRE(request);
  REQUIRE(upstream);
  CHECK(request->attributes.at("http.response.status_code") == "503");
  CHECK(request->status == 2);
  CHECK(request->attributes.at("error.type") == "503");
  CHECK(upstream->attributes.count("http.response.status_code") == 0);
  CHECK(upstream->status == 2);
  CHECK(upstream->attributes.at("error.type") == "no_response");
  CHECK(upstream->attributes.at("kvfleet.upstream.outcome") == "retry");
  CHECK(receiver.errors().empty());
}

}  // namespace kvfleet::test
