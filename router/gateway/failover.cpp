// Mid-stream failover: a stream whose replica dies or stalls after the client got its first bytes goes
// on on another replica, exactly (docs/router.md). The splice (stream_splice.h) keeps the token ids
// streamed so far; the resume request is the client's request plus kvfleet_resume (Contract 4), routed
// by the tree like any other (the prompt's prefix may be cached elsewhere), excluding the replicas
// that failed it; its stream continues the client's under the same id and created.
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/json.hpp>

#include "kvfleet/http/json_error.h"
#include "kvfleet/http/sse.h"
#include "router/gateway/gateway.h"
#include "router/gateway/relay_util.h"

namespace kvfleet::router {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

// The watchdog's state, shared with its timer's handler (which may run after the relay has moved on).
struct Watch {
  bool armed = false;  // a read is pending: a firing closes the upstream connection
  bool fired = false;
};

}  // namespace

bool Gateway::failover_eligible(std::string_view path, const json::object& body) {
  const json::value* stream = body.if_contains("stream");
  if (!stream || !stream->is_bool() || !stream->as_bool()) return false;
  if (const json::value* n = body.if_contains("n"); n && !n->is_null() && !(n->is_int64() && n->as_int64() == 1))
    return false;  // several choices interleave in one stream: not resumed (they end with an error event)
  if (path == "/v1/chat/completions") return true;
  const json::value* prompt = body.if_contains("prompt");
  if (!prompt) return false;
  if (prompt->is_string()) return true;
  if (!prompt->is_array()) return false;
  const json::array& a = prompt->as_array();
  return a.size() == 1 || (!a.empty() && a.front().is_number());  // one prompt (text, or token ids)
}

bool Gateway::needs_seed(const json::object& body) {
  if (const json::value* seed = body.if_contains("seed"); seed && !seed->is_null()) return false;
  const json::value* t = body.if_contains("temperature");
  return !(t && t->is_number() && t->to_number<double>() == 0.0);  // greedy draws nothing
}

awaitable<bool> Gateway::relay_spliced(http::HttpClient& client, const http::ResponseHead& head, ReplicaLink& link,
                                       http::ResponseWriter& w, double started, SpliceState& s, TryResult& result) {
  result.verdict = Verdict::unknown;
  if (!s.begun) {
    if (!co_await begin_client_stream(client, head, link.url, w)) co_return false;
    s.begun = true;
  }
  // No byte for stream_stall_timeout once this replica's stream has begun: closed, as if it had died.
  auto watch = std::make_shared<Watch>();
  asio::steady_timer watchdog(co_await asio::this_coro::executor);
  bool first = true, broke = false, client_stalled = false;
  for (;;) {
    if (!first) {
      watchdog.expires_after(config_.stream_stall_timeout);
      watch->armed = true;
      watchdog.async_wait([watch, c = &client](const boost::system::error_code& ec) {
        if (ec || !watch->armed) return;  // (armed: the relay still waits in read_some, `c` alive)
        watch->fired = true;
        c->close();
      });
    }
    std::optional<std::string> piece;
    try {
      piece = co_await client.read_some();
    } catch (const std::exception&) {
      broke = true;
    }
    watch->armed = false;
    watchdog.cancel();
    if (broke || !piece) break;
    if (first && s.resumes == 0) {
      metrics_.histogram("kvfleet_router_ttft_seconds", "Time to the first streamed bytes from the replica",
                         latency_buckets())
          .Observe(seconds_now() - started);
    }
    first = false;
    const std::string out = s.splice.feed(*piece);
    if (out.empty()) continue;
    const auto write_started = std::chrono::steady_clock::now();
    if (!co_await w.write(out)) {
      client.close();
      co_return false;
    }
    client_stalled |= std::chrono::steady_clock::now() - write_started >= kClientStall;
  }
  if (w.client_gone()) {
    client.close();
    co_return false;
  }
  if (!broke) {
    const std::string rest = s.splice.finish();
    if (!rest.empty()) co_await w.write(rest);
    count_request(link.url, std::to_string(head.status), &link);
    metrics_.histogram("kvfleet_router_upstream_latency_seconds", "Time to the replica's whole answer", latency_buckets())
        .Observe(seconds_now() - started);
    if (s.resumes > 0)
      metrics_.counter("kvfleet_router_failovers_succeeded_total", "Broken streams that ended cleanly on another replica")
          .Increment();
    co_await w.finish();
    result.verdict = Verdict::success;
    co_return false;
  }
  client.close();  // a stalled replica's late bytes never reach the client
  s.splice.drop_partial();
  if (watch->fired)
    metrics_.counter("kvfleet_router_upstream_stalls_total", "Streams whose replica sent nothing for stream_stall_timeout")
        .Increment();
  count_request(link.url, watch->fired ? "upstream_stall" : "upstream_error", &link);
  result.verdict = client_stalled ? Verdict::unknown : Verdict::failure;  // the slow client may have caused it
  if (s.splice.resumable()) co_return true;
  const std::string error = http::json_error_body("the replica failed mid-stream", "server_error", "", "upstream_error");
  const std::string event = http::sse_format(error) + "data: [DONE]\n\n";
  co_await w.write(event);
  co_await w.finish();
  co_return false;
}

awaitable<void> Gateway::fail_over(const http::Request& req, const json::object& body, RoutePlan& plan,
                                   std::vector<ReplicaId>& tried, http::ResponseWriter& w, SpliceState& s,
                                   trace::Span& request_span, const std::string& trace_state) {
  http::Request resume, routed;
  while (s.resumes < config_.failover_max_attempts && !w.client_gone()) {
    CircuitBreaker::Ticket ticket;
    const int attempt = static_cast<int>(tried.size());
    std::shared_ptr<ReplicaLink> link = traced_route(request_span, plan, tried, ticket, attempt);
    if (!link) break;
    trace::Span try_span = upstream_span(request_span, *link, attempt);
    try_span.set("kvfleet.failover.resume", static_cast<std::int64_t>(s.resumes + 1));
    const trace::SpanContext upstream_trace = try_span.context(trace_state);
    // Nothing of the stream reached the client yet (its head only): the request as it came.
    resume.method = req.method;
    resume.target = req.target;
    resume.headers = req.headers;
    resume.body = s.splice.started() ? s.splice.resume_body(body) : req.body;
    s.resumes += 1;
    metrics_.counter("kvfleet_router_failover_attempts_total", "Broken streams sent on to another replica").Increment();
    TryResult result;
    Outcome outcome = Outcome::done;
    std::exception_ptr error;
    try {
      const http::Request& sent = with_routing_headers(resume, plan, routed);
      outcome = co_await forward(*link, sent, w, false, result, &s, &upstream_trace);
    } catch (...) {
      error = std::current_exception();
    }
    end_upstream_span(try_span, outcome, error || result.verdict == Verdict::failure, result.status);
    release(*link, plan, ticket, error ? Verdict::unknown : result.verdict);
    if (error) std::rethrow_exception(error);
    if (outcome == Outcome::done) {
      if (result.verdict == Verdict::failure) mark_broken(request_span);  // ended by an error event
      co_return;
    }
    tried.push_back(link->slot);
  }
  if (w.client_gone()) co_return;
  metrics_.counter("kvfleet_router_failovers_failed_total", "Broken streams no other replica could resume").Increment();
  mark_broken(request_span);
  const std::string error = http::json_error_body("the replica failed mid-stream and no other replica could resume it",
                                                  "server_error", "", "upstream_error");
  const std::string event = http::sse_format(error) + "data: [DONE]\n\n";
  co_await w.write(event);
  co_await w.finish();
}

}  // namespace kvfleet::router
