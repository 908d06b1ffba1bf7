// Traces across real processes: a client's traceparent through kvfleet-router to a kvfleet-replica, both
// exporting to a test OTLP receiver that checks every post against OTLP's JSON schema; and a dead or stuck
// collector, which costs requests nothing but the spans (counted as dropped).
#include <doctest/doctest.h>

#include <thread>

#include "otlp_receiver.h"
#include "router_integration/router_fixture.h"

namespace kvfleet::test {
namespace {

constexpr std::string_view kClientTrace = "0af7651916cd43dd8448eb211c80319c";
constexpr std::string_view kClientSpan = "b7ad6b7169203331";

template <class F>
bool eventually(F f, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return f();
}

http::Response post(std::uint16_t port, const std::string& target, const std::string& body,
                    const std::string& traceparent = "", const std::string& tracestate = "") {
  http::Headers h{{"Content-Type", "application/json"}};
  if (!traceparent.empty()) h.add("traceparent", traceparent);
  if (!tracestate.empty()) h.add("tracestate", tracestate);
  return http::http_request("127.0.0.1", port, "POST", target, body, h, std::chrono::seconds(60));
}

std::vector<ReceivedSpan> of_trace(const std::vector<ReceivedSpan>& all, std::string_view trace_id) {
  std::vector<ReceivedSpan> out;
  for (const auto& s : all)
    if (s.trace_id == trace_id) out.push_back(s);
  return out;
}

const ReceivedSpan* named(const std::vector<ReceivedSpan>& spans, std::string_view name) {
  const ReceivedSpan* found = nullptr;
  for (const auto& s : spans)
    if (s.name == name) {
      REQUIRE_MESSAGE(!found, "two spans named " << name);
      found = &s;
    }
  return found;
}

// One request's whole trace: the router's spans under `root_parent` ("" when the router started the
// trace), the replica's under the router's upstream span.
void check_trace(const std::vector<ReceivedSpan>& spans, const std::string& root_parent, const std::string& replica_url) {
  const ReceivedSpan* request = named(spans, "router.request");
  const ReceivedSpan* queue = named(spans, "router.queue_wait");
  const ReceivedSpan* route = named(spans, "router.route");
  const ReceivedSpan* upstream = named(spans, "router.upstream");
  const ReceivedSpan* replica = named(spans, "replica.request");
  REQUIRE(request);
  REQUIRE(queue);
  REQUIRE(route);
  REQUIRE(upstream);
  REQUIRE(replica);
  CHECK(request->service == "kvfleet-router");
  CHECK(request->kind == 2);  // SERVER
  CHECK(request->parent_span_id == root_parent);
  for (const auto* s : {queue, route, upstream}) CHECK(s->parent_span_id == request->span_id);
  CHECK(upstream->kind == 3);  // CLIENT
  CHECK(route->attributes.at("kvfleet.route.replica") == replica_url);
  CHECK_FALSE(route->attributes.at("kvfleet.route.reason").empty());
  CHECK(route->attributes.count("kvfleet.route.matched_blocks") == 1);
  CHECK(route->attributes.count("kvfleet.route.prompt_blocks") == 1);
  // The replica's span is a child of the router's upstream span, in the same trace.
  CHECK(replica->service == "kvfleet-replica");
  CHECK(replica->kind == 2);
  CHECK(replica->parent_span_id == upstream->span_id);
  CHECK(replica->events == std::vector<std::string>{"first_token"});
  CHECK(replica->attributes.at("gen_ai.usage.output_tokens") == "3");
  for (const char* phase : {"replica.queue", "replica.prefill", "replica.decode"}) {
    CAPTURE(phase);
    const ReceivedSpan* p = named(spans, phase);
    REQUIRE(p);
    CHECK(p->parent_span_id == replica->span_id);
  }
  CHECK(spans.size() == 8);
}

}  // namespace

TEST_CASE("a request through router and replica is one trace: the client's, with the replica under the router") {
  OtlpReceiver receiver;
  ReplicaProcess replica({"--otlp-endpoint", receiver.url()});
  RouterProcess router({&replica}, {"--otlp-endpoint", receiver.url()});
  const std::string body = R"({"model":"tiny-qwen","prompt":"Hello there, traced","max_tokens":3,"ignore_eos":true})";
  const std::string chat = R"({"model":"tiny-qwen","messages":[{"role":"user","content":"hi"}],"max_tokens":3,)"
                           R"("ignore_eos":true,"stream":true})";

  // 1: the client's trace. 2: a malformed traceparent (uppercase hex), which starts a new trace. 3: none.
  const std::string traceparent = "00-" + std::string(kClientTrace) + "-" + std::string(kClientSpan) + "-01";
  REQUIRE(post(router.port(), "/v1/completions", body, traceparent, "vendor=opaque").status == 200);
  const http::Response streamed =
      post(router.port(), "/v1/chat/completions", chat, "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01");
  REQUIRE(streamed.status == 200);
  CHECK(streamed.body.find("[DONE]") != std::string::npos);
  REQUIRE(post(router.port(), "/v1/completions", body).status == 200);

  // 3 traces x 8 spans (router: request, queue_wait, route, upstream; replica: request, queue, prefill, decode).
  REQUIRE(eventually([&] { return receiver.spans().size() >= 24; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a stray extra span would show by now
  const auto spans = receiver.spans();
  CHECK(receiver.errors().empty());
  for (const auto& e : receiver.errors()) MESSAGE(e);
  CHECK(spans.size() == 24);

  const auto client = of_trace(spans, kClientTrace);
  check_trace(client, std::string(kClientSpan), replica.base_url());

  // The other two started traces of their own at the router.
  std::set<std::string> roots;
  for (const auto& s : spans)
    if (s.name == "router.request" && s.trace_id != kClientTrace) {
      CHECK(s.parent_span_id.empty());
      roots.insert(s.trace_id);
    }
  REQUIRE(roots.size() == 2);
  for (const auto& id : roots) {
    CAPTURE(id);
    const auto t = of_trace(spans, id);
    check_trace(t, "", replica.base_url());
    CHECK(named(t, "router.request")->attributes.at("url.path") == named(t, "replica.request")->attributes.at("url.path"));
  }
  CHECK(router.metric("kvfleet_otlp_spans_exported_total") == 12);
  CHECK(router.metric("kvfleet_otlp_spans_dropped_total") == 0);
}

TEST_CASE("a replica called directly with a traceparent puts its spans in the caller's trace") {
  OtlpReceiver receiver;
  ReplicaProcess replica({"--otlp-endpoint", receiver.url()});
  const std::string traceparent = "00-" + std::string(kClientTrace) + "-" + std::string(kClientSpan) + "-01";
  REQUIRE(post(replica.port(), "/v1/completions", R"({"model":"tiny-qwen","prompt":"Hi","max_tokens":2})", traceparent)
              .status == 200);
  REQUIRE(eventually([&] { return receiver.spans().size() >= 4; }));
  const auto spans = receiver.spans();
  const ReceivedSpan* request = named(spans, "replica.request");
  REQUIRE(request);
  CHECK(request->trace_id == kClientTrace);
  CHECK(request->parent_span_id == kClientSpan);
  CHECK(request->attributes.at("gen_ai.operation.name") == "text_completion");
  CHECK(request->attributes.at("gen_ai.request.model") == "tiny-qwen");
  CHECK(receiver.errors().empty());
}

TEST_CASE("a dead collector: requests are served as before; the spans are dropped and counted") {
  boost::asio::io_context io;
  std::uint16_t dead_port = 0;
  {
    boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    dead_port = a.local_endpoint().port();
  }
  const std::string dead = "http://127.0.0.1:" + std::to_string(dead_port);
  ReplicaProcess replica({"--otlp-endpoint", dead});
  RouterProcess router({&replica}, {"--otlp-endpoint", dead});
  const std::string body = R"({"model":"tiny-qwen","prompt":"Hello","max_tokens":2})";
  for (int i = 0; i < 5; ++i) REQUIRE(post(router.port(), "/v1/completions", body).status == 200);
  CHECK(eventually([&] { return router.metric("kvfleet_otlp_spans_dropped_total", "export_failed") == 20; }));
  CHECK(eventually([&] { return replica.metric("kvfleet_otlp_spans_exported_total") == 0; }));
  CHECK(router.metric("kvfleet_otlp_spans_exported_total") == 0);
}

TEST_CASE("a stuck collector holds only the exporter: requests go on while its post hangs") {
  OtlpReceiver stuck(/*hang=*/true);
  ReplicaProcess replica;
  RouterProcess router({&replica}, {"--otlp-endpoint", stuck.url()});
  const std::string body = R"({"model":"tiny-qwen","prompt":"Hello","max_tokens":2})";
  REQUIRE(post(router.port(), "/v1/completions", body).status == 200);
  REQUIRE(eventually([&] { return stuck.posts() == 1; }));  // the router's exporter now waits on it
  // Each post hangs until its 2 s deadline: a request that waited on the exporter would take that long.
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) REQUIRE(post(router.port(), "/v1/completions", body).status == 200);
  const auto took = std::chrono::steady_clock::now() - started;
  CHECK(took < std::chrono::seconds(10));
  CHECK(stuck.posts() <= 1 + std::chrono::duration_cast<std::chrono::seconds>(took).count() / 2 + 1);
  // Its deadline passes: that batch is counted as dropped.
  CHECK(eventually([&] { return router.metric("kvfleet_otlp_spans_dropped_total", "export_failed") >= 4; }));
}

}  // namespace kvfleet::test
