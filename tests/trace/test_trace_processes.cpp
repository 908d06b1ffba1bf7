// Traces across real processes: a client's traceparent through kvfleet-router to a kvfleet-replica, both
// exporting to a test OTLP receiver that checks every post against OTLP's JSON schema; and a dead or stuck
// collector, which costs requests nothing but the spans (counted as dropped).
#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>
#include <csignal>
#include <thread>

#include "trace_support.h"

namespace kvfleet::test {
namespace {

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
  // The replica's answer and the client's: 200, so neither span is an error.
  CHECK(upstream->attributes.at("http.response.status_code") == "200");
  CHECK(request->attributes.at("http.response.status_code") == "200");
  CHECK(upstream->status == 0);
  CHECK(request->status == 0);
  CHECK(upstream->attributes.count("error.type") == 0);
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

namespace kvfleet::test {
namespace {

// A program's exit status and everything it printed (stdout and stderr).
std::pair<int, std::string> run_to_exit(const std::string& command) {
  ChildProcess p({"/bin/sh", "-c", "exec " + command + " 2>&1"});
  std::string out;
  while (auto line = p.read_line(std::chrono::seconds(30))) out += *line + "\n";
  return {p.wait(std::chrono::seconds(30)), out};
}

}  // namespace

TEST_CASE("otlp_endpoint: from YAML on both programs; a bad one is refused at startup, naming the setting") {
  for (const char* program : {"kvfleet-router", "kvfleet-replica"}) {
    CAPTURE(program);
    const auto [status, out] = run_to_exit(bin_dir() + "/" + program + " --model /nonexistent --otlp-endpoint https://collector:4318");
    CHECK(status != 0);
    CHECK(out.find("otlp_endpoint must be an http:// URL") != std::string::npos);
  }
  OtlpReceiver receiver;
  TempDir dir;
  const auto yaml = dir / "tracing.yaml";
  std::ofstream(yaml) << "otlp_endpoint: " << receiver.url() << "\n";
  ReplicaProcess replica({"--config", yaml.string()});
  RouterProcess router({&replica}, {"--config", yaml.string()});
  REQUIRE(post(router.port(), "/v1/completions", R"({"model":"tiny-qwen","prompt":"Hi","max_tokens":2})").status == 200);
  CHECK(eventually([&] {
    std::set<std::string> services;
    for (const auto& s : receiver.spans()) services.insert(s.service);
    return services == std::set<std::string>{"kvfleet-replica", "kvfleet-router"};
  }));
  CHECK(receiver.errors().empty());
}

}  // namespace kvfleet::test

namespace kvfleet::test {

TEST_CASE("pd: the decode replica's KV pull carries the trace on to the prefill replica") {
  OtlpReceiver receiver;
  ReplicaProcess p({"--role", "prefill", "--otlp-endpoint", receiver.url()});
  ReplicaProcess d({"--role", "decode", "--otlp-endpoint", receiver.url()});
  const std::string traceparent = "00-" + std::string(kClientTrace) + "-" + std::string(kClientSpan) + "-01";
  http::Headers h{{"Content-Type", "application/json"}, {"traceparent", traceparent}, {"x-kvfleet-prefill-from", p.base_url()}};
  const std::string body = R"({"model":"tiny-qwen","prompt":"Tell me, at some length and with examples, about the prefill )"
                           R"(and decode phases of serving a large language model, and why they differ.","max_tokens":2})";
  REQUIRE(http::http_request("127.0.0.1", d.port(), "POST", "/v1/completions", body, h, std::chrono::seconds(60)).status == 200);
  std::vector<ReceivedSpan> spans;
  REQUIRE(eventually([&] {
    spans = of_trace(receiver.spans(), kClientTrace);
    return named(spans, "replica.kv_prefill") && named(spans, "replica.decode");
  }));
  const ReceivedSpan* request = named(spans, "replica.request");
  const ReceivedSpan* pull = named(spans, "replica.kv_transfer");
  const ReceivedSpan* prefill_side = named(spans, "replica.kv_prefill");
  REQUIRE(request);
  REQUIRE(pull);
  CHECK(request->parent_span_id == kClientSpan);
  CHECK(pull->parent_span_id == request->span_id);
  CHECK(pull->kind == 3);
  CHECK(pull->attributes.at("kvfleet.pd.prefill_from") == p.base_url());
  CHECK(std::stoll(pull->attributes.at("kvfleet.pd.imported_blocks")) > 0);
  CHECK(pull->attributes.count("kvfleet.pd.fallback") == 0);
  CHECK(prefill_side->parent_span_id == pull->span_id);  // P's span, under D's pull
  CHECK(prefill_side->attributes.at("http.response.status_code") == "200");
  CHECK(receiver.errors().empty());
}

}  // namespace kvfleet::test

namespace kvfleet::test {
namespace {

// Streams `body` through the router, SIGKILLing the replica that serves it once the first bytes arrive.
std::string stream_killing_first(std::uint16_t port, const std::string& body, const std::string& traceparent,
                                 ReplicaProcess& a, ReplicaProcess& b) {
  namespace asio = boost::asio;
  asio::io_context io;
  std::string raw;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    http::HttpClientConfig cc;
    cc.io_timeout = std::chrono::seconds(60);
    http::HttpClient client(co_await asio::this_coro::executor, cc);
    const std::string host = "127.0.0.1";
    co_await client.connect(host, port);
    http::Request request;
    request.method = "POST";
    request.target = "/v1/completions";
    request.body = body;
    request.headers.set("content-type", "application/json");
    request.headers.set("traceparent", traceparent);
    co_await client.send(request);
    const http::ResponseHead head = co_await client.read_head();
    REQUIRE(head.status == 200);
    const std::string* served = head.headers.find("x-kvfleet-replica");
    REQUIRE(served);
    ReplicaProcess& victim = *served == a.base_url() ? a : b;
    bool first = true;
    while (std::optional<std::string> piece = co_await client.read_some()) {
      raw += *piece;
      if (first) victim.process().signal(SIGKILL);
      first = false;
    }
  }, [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  io.run();
  return raw;
}

}  // namespace

TEST_CASE("failover: a stream resumed on another replica stays one trace, the resume under its own upstream span") {
  OtlpReceiver receiver;
  ReplicaProcess a({"--otlp-endpoint", receiver.url()}), b({"--otlp-endpoint", receiver.url()});
  RouterProcess router({&a, &b}, {"--otlp-endpoint", receiver.url()});
  const std::string traceparent = "00-" + std::string(kClientTrace) + "-" + std::string(kClientSpan) + "-01";
  const std::string body = R"({"model":"tiny-qwen","prompt":"Once upon a time in a fleet of replicas","max_tokens":400,)"
                           R"("stream":true,"ignore_eos":true,"temperature":0})";
  const std::string raw = stream_killing_first(router.port(), body, traceparent, a, b);
  CHECK(raw.find("\"error\"") == std::string::npos);
  CHECK(raw.find("[DONE]") != std::string::npos);
  std::vector<ReceivedSpan> spans;
  REQUIRE(eventually([&] {
    spans = of_trace(receiver.spans(), kClientTrace);
    return named(spans, "router.request") && named(spans, "replica.decode");
  }));
  std::vector<const ReceivedSpan*> tries;
  for (const auto& s : spans)
    if (s.name == "router.upstream") tries.push_back(&s);
  REQUIRE(tries.size() == 2);
  const ReceivedSpan* resumed = tries[0]->attributes.count("kvfleet.failover.resume") ? tries[0] : tries[1];
  const ReceivedSpan* broken = resumed == tries[0] ? tries[1] : tries[0];
  CHECK(broken->attributes.at("kvfleet.upstream.outcome") == "broke");
  CHECK(resumed->attributes.at("kvfleet.upstream.outcome") == "done");
  CHECK(resumed->attributes.at("kvfleet.failover.resume") == "1");
  // The survivor's spans hang under the resume's upstream span (the killed replica exported nothing).
  const ReceivedSpan* replica = named(spans, "replica.request");
  REQUIRE(replica);
  CHECK(replica->parent_span_id == resumed->span_id);
  CHECK(receiver.errors().empty());
}

}  // namespace kvfleet::test
