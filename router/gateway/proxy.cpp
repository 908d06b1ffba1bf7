// Admission, forwarding with retries, and relaying the replica's answer piece by piece.
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/json.hpp>
#include <random>

#include "kvfleet/http/json_error.h"
#include "kvfleet/http/sse.h"
#include "router/gateway/gateway.h"
#include "router/gateway/relay_util.h"
#include "router/gateway/responses_routing.h"
#include "router/gateway/status_writer.h"

namespace kvfleet::router {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

// Request headers worth passing upstream (the rest are hop-by-hop or set by the client). The client's
// Authorization is its key to the router, not to the replica: passed on only with forward_authorization.
constexpr std::string_view kForwarded[] = {"content-type", "accept", "x-request-id", "x-kvfleet-prefill-from",
                                           "x-data-parallel-rank", "traceparent", "tracestate"};

awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_after(d);
  co_await timer.async_wait(asio::use_awaitable);
}

}  // namespace

awaitable<void> Gateway::proxy(const http::Request& req, http::ResponseWriter& client) {
  // The router's spans (kvfleet/trace/span.h): this request's under the client's traceparent, or a new trace.
  const auto client_trace = trace::parse_traceparent(req.headers.find("traceparent"), req.headers.find("tracestate"));
  const std::string trace_state = client_trace ? client_trace->state : std::string();
  trace::Span request_span = trace::start_span(client_trace, "router.request", trace::SpanKind::server);
  request_span.set("http.request.method", req.method);
  request_span.set("url.path", std::string(req.path()));
  StatusWriter w(client);  // the status the client gets, for the span
  std::exception_ptr error;
  try {
    co_await proxy_request(req, w, request_span, trace_state);
  } catch (...) {
    error = std::current_exception();
  }
  end_request_span(request_span, w.status(), error != nullptr);
  if (error) std::rethrow_exception(error);
}

awaitable<void> Gateway::proxy_request(const http::Request& req, http::ResponseWriter& w, trace::Span& request_span,
                                       const std::string& trace_state) {
  if (!authorized(req)) {
    co_await w.send(http::json_error(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                     "authentication_error", "", "invalid_api_key"));
    co_return;
  }
  if (draining_) {
    co_await w.send(http::json_error(503, "the router is shutting down", "overloaded_error"));
    co_return;
  }
  json::error_code ec;
  const json::value body = json::parse(req.body, ec);
  if (ec || !body.is_object()) {
    co_await w.send(http::json_error(400, "the request body must be a JSON object", "invalid_request_error"));
    co_return;
  }
  FlowKey flow;
  if (auto bad = flow_of(req, body.as_object(), flow)) {
    co_await w.send(http::json_error(400, bad->first, "invalid_request_error", bad->second));
    co_return;
  }
  request_span.set("kvfleet.tenant", flow.tenant);
  request_span.set("kvfleet.priority", flow.priority);
  trace::Span queue_span = trace::child_span(request_span, "router.queue_wait");
  const bool admitted_now = co_await admit(w, flow);
  queue_span.set("kvfleet.admitted", admitted_now);
  end_span(queue_span);
  if (!admitted_now) {
    if (w.client_gone()) co_return;  // left while queued: nobody to answer
    metrics_.counter("kvfleet_router_rejected_total", "Requests refused with 429 (queue full)").Increment();
    count_tenant(flow.tenant, "rejected");
    http::Response busy = http::json_error(429, "too many requests from tenant '" + flow.tenant +
                                                    "' waiting; retry after the Retry-After seconds", "rate_limit_error");
    busy.headers.set("retry-after", std::to_string(retry_after_seconds(flow.tenant)));
    co_await w.send(std::move(busy));
    co_return;
  }
  count_tenant(flow.tenant, "admitted");
  struct Admitted {  // gives the slot back however the handler ends
    Gateway& g;
    const std::string& tenant;
    ~Admitted() { g.release_slot(tenant); }
  } admitted{*this, flow.tenant};

  RoutePlan plan = this->plan(req.path(), body.as_object(), req);
  std::optional<SpliceState> splice;  // a stream that may fail over mid-way (failover.cpp)
  const http::Request* sent_request = &req;
  const json::object* sent_body = &body.as_object();
  http::Request seeded_request;
  json::object seeded_body;
  if (config_.failover && failover_eligible(req.path(), body.as_object())) {
    splice.emplace();
    // An unseeded sampled stream gets a seed of the router's drawing, so that a failed-over stream
    // continues the same random draws: the same distribution as no seed, and resumable token for token.
    if (needs_seed(body.as_object())) {
      seeded_body = body.as_object();
      seeded_body["seed"] = static_cast<std::int64_t>(std::random_device{}() & 0x7fffffff);
      seeded_request = req;
      seeded_request.body = json::serialize(seeded_body);
      sent_request = &seeded_request;
      sent_body = &seeded_body;
    }
  }
  std::vector<ReplicaId> tried;
  // A follow-up of a stored response goes to the replica that stored it, and only there.
  std::shared_ptr<ReplicaLink> owner;
  if (req.path() == "/v1/responses")
    if (const auto continued = continued_response(body.as_object())) owner = co_await find_response_owner(*continued);
  if (owner) tried = all_but(*owner);
  std::minstd_rand jitter(static_cast<unsigned>(now_tick()));
  TryResult result;
  http::Request routed_request;  // with the router's x-kvfleet-prefill-from (pd mode) / x-data-parallel-rank
  for (int attempt = 0; attempt < config_.max_attempts && !w.client_gone(); ++attempt) {
    if (attempt > 0) {
      const auto base = config_.retry_backoff * (1 << std::min(attempt - 1, 6));
      const auto wait = base + std::chrono::milliseconds(jitter() % (base.count() + 1));
      co_await sleep_for(wait);
    }
    CircuitBreaker::Ticket ticket;
    std::shared_ptr<ReplicaLink> link = traced_route(request_span, plan, tried, ticket, attempt);
    if (!link) break;
    trace::Span try_span = upstream_span(request_span, *link, attempt);
    const trace::SpanContext upstream_trace = try_span.context(trace_state);
    if (attempt > 0)
      metrics_.counter("kvfleet_router_retries_total", "Requests sent again to another replica").Increment();
    Outcome outcome = Outcome::done;
    std::exception_ptr error;
    result.verdict = Verdict::unknown;
    result.status = 0;
    try {
      const http::Request& sent = with_routing_headers(*sent_request, plan, routed_request);
      outcome = co_await forward(*link, sent, w, attempt + 1 == config_.max_attempts, result, splice ? &*splice : nullptr,
                                 &upstream_trace);
    } catch (...) {
      error = std::current_exception();
    }
    end_upstream_span(try_span, outcome, error || result.verdict == Verdict::failure, result.status);
    release(*link, plan, ticket, error ? Verdict::unknown : result.verdict);
    if (error) std::rethrow_exception(error);
    if (outcome == Outcome::done) {
      if (result.verdict == Verdict::failure && w.started()) mark_broken(request_span);  // ended by an error event
      co_return;
    }
    tried.push_back(link->slot);
    if (outcome == Outcome::broke) {  // the client's stream is open: it goes on elsewhere, or ends there
      co_await fail_over(*sent_request, *sent_body, plan, tried, w, *splice, request_span, trace_state);
      co_return;
    }
  }
  if (w.client_gone()) co_return;
  if (result.overloaded) {  // every replica tried was overloaded: its answer, not a generic one
    count_request("none", std::to_string(result.overloaded->status));
    co_await w.send(std::move(*result.overloaded));
    co_return;
  }
  count_request("none", "503");
  co_await w.send(http::json_error(503, owner ? "the replica that stored the response this one continues cannot serve it now"
                                              : "no replica could serve the request",
                                   "overloaded_error"));
}

namespace {

// The client request as the replica gets it (only the kForwarded headers, and the Authorization
// the configuration asks for).
http::Request upstream_request(const http::Request& req, const RouterConfig& config, bool token_ids,
                               const trace::SpanContext* trace) {
  http::Request upstream;
  upstream.method = req.method;
  upstream.target = req.target;
  upstream.body = req.body;
  for (const auto& name : kForwarded)
    if (const std::string* v = req.headers.find(name)) upstream.headers.set(name, *v);
  const std::string* client_auth = req.headers.find("authorization");
  if (config.forward_authorization && client_auth) {
    upstream.headers.set("authorization", *client_auth);
  } else if (!config.replica_api_key.empty()) {
    upstream.headers.set("authorization", "Bearer " + config.replica_api_key);
  }
  if (token_ids) upstream.headers.set("x-kvfleet-token-ids", "true");  // for mid-stream failover (Contract 4)
  if (trace) {  // the replica's spans are children of the router's upstream span
    upstream.headers.set("traceparent", trace::format_traceparent(*trace));
    upstream.headers.erase("tracestate");
    if (!trace->state.empty()) upstream.headers.set("tracestate", trace->state);
  }
  return upstream;
}

// What an answer says about the replica's health: a 5xx is its fault, a 4xx the client's (it proves the
// replica works), and 503/429 (draining, queue full) say it is busy, not broken.
Verdict verdict_of(int status) {
  if (status == 503 || status == 429) return Verdict::unknown;
  return status >= 500 ? Verdict::failure : Verdict::success;
}

// A whole (non-streamed) answer as the client gets it.
http::Response replica_response(const http::ResponseHead& head, std::string body, const std::string& replica) {
  http::Response response;
  response.status = head.status;
  response.body = std::move(body);
  const std::string* type = head.headers.find("content-type");
  response.headers.set("content-type", type ? *type : "application/json");
  response.headers.set("x-kvfleet-replica", replica);
  relay_rank_header(head, response.headers);
  if (const std::string* after = head.headers.find("retry-after")) response.headers.set("retry-after", *after);
  return response;
}

// What a pooled connection that the replica closed while it sat idle fails with, before any byte
// of a response arrived: safe to send again on a new connection.
bool stale_connection_error(const boost::system::system_error& e) {
  const auto ec = e.code();
  return ec == boost::beast::http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
}

}  // namespace

awaitable<http::ResponseHead> Gateway::exchange(ReplicaLink& link, const http::Request& upstream,
                                                std::unique_ptr<http::HttpClient>& client, bool& connected) {
  const auto executor = co_await asio::this_coro::executor;
  client = link.pool.take(executor);
  if (client) {
    connected = true;
    bool stale = false;
    http::ResponseHead head;
    try {
      co_await client->send(upstream);
      head = co_await client->read_head();
    } catch (const boost::system::system_error& e) {
      if (!stale_connection_error(e)) throw;
      stale = true;
    }
    if (!stale) co_return head;
    metrics_.counter("kvfleet_router_upstream_stale_retries_total",
                     "Requests sent again on a new connection after a pooled one turned out closed")
        .Increment();
  }
  connected = false;
  http::HttpClientConfig cc;
  cc.connect_timeout = config_.connect_timeout;
  cc.io_timeout = config_.upstream_timeout;
  cc.header_limit = 64 * 1024;  // a replica's response head is small; more is a broken or hostile replica
  client = std::make_unique<http::HttpClient>(executor, cc);
  const std::string host = link.address.host;
  co_await client->connect(host, link.address.port);
  connected = true;
  co_await client->send(upstream);
  co_return co_await client->read_head();
}

// Done: the replica's answer (or an error event in its stream) reached the client, or the client
// left. Retry: nothing reached the client, so another replica may try; an overloaded answer (503,
// 429) is kept in `result` for when no other replica can take the request, or passed on when
// `last_try`.
awaitable<Gateway::Outcome> Gateway::forward(ReplicaLink& link, const http::Request& req, http::ResponseWriter& w,
                                             bool last_try, TryResult& result, SpliceState* splice,
                                             const trace::SpanContext* trace) {
  std::unique_ptr<http::HttpClient> client;
  // Closing the upstream connection aborts the request on the replica (and frees its blocks); a
  // connection closed that way never goes back to the pool.
  w.on_disconnect([&client] {
    if (client) client->close();
  });
  struct UnhookUpstreamCloser {  // the callback must not outlive `client`
    http::ResponseWriter& w;
    ~UnhookUpstreamCloser() { w.on_disconnect([] {}); }
  } unhook_closer{w};

  const http::Request upstream = upstream_request(req, config_, splice != nullptr, trace);
  const double started = seconds_now();
  bool connected = false;
  bool failed = false;
  http::ResponseHead head;
  try {
    head = co_await exchange(link, upstream, client, connected);
  } catch (const std::exception&) {
    failed = true;
  }
  if (failed) {
    if (w.client_gone()) co_return Outcome::done;
    if (!connected) note_connect_refused(link);
    result.verdict = Verdict::failure;
    co_return Outcome::retry;
  }
  result.status = head.status;
  if (const std::string* id = head.headers.find("x-kvfleet-response-id"))
    response_owners_.remember(*id, link.url);  // a stored response: its follow-ups come here
  const bool retry_overload = (head.status == 503 || head.status == 429) && !last_try;
  const std::string* type = head.headers.find("content-type");
  const bool streamed = head.chunked || (type && type->find("text/event-stream") != std::string::npos);
  if (splice && splice->begun && (head.status != 200 || !streamed)) {  // a resume refused: try another
    client->close();
    result.verdict = verdict_of(head.status == 200 ? 502 : head.status);
    co_return Outcome::retry;
  }
  if (!retry_overload && streamed && splice && head.status == 200) {
    const bool broke = co_await relay_spliced(*client, head, link, w, started, *splice, result);
    if (result.verdict == Verdict::success) link.pool.give_back(std::move(client));
    co_return broke ? Outcome::broke : Outcome::done;
  }
  if (!retry_overload && streamed) {
    result.verdict = co_await relay_stream(*client, head, link, w, started, req.path() == "/v1/responses");
    if (result.verdict == Verdict::success) {
      result.verdict = verdict_of(head.status);
      link.pool.give_back(std::move(client));
    }
    co_return Outcome::done;
  }
  std::string body;
  try {
    body = co_await client->read_body();
  } catch (const std::exception&) {
    failed = true;
  }
  if (failed) {  // died before answering: nothing reached the client yet
    if (w.client_gone()) co_return Outcome::done;
    result.verdict = Verdict::failure;
    co_return Outcome::retry;
  }
  link.pool.give_back(std::move(client));  // read to its end: free for the next request
  result.verdict = verdict_of(head.status);
  http::Response response = replica_response(head, std::move(body), link.url);
  if (retry_overload) {
    count_overloaded(link, head.status);
    result.overloaded = std::move(response);
    co_return Outcome::retry;
  }
  metrics_.histogram("kvfleet_router_upstream_latency_seconds", "Time to the replica's whole answer", latency_buckets())
      .Observe(seconds_now() - started);
  count_request(link.url, std::to_string(head.status), &link);
  co_await w.send(std::move(response));
  co_return Outcome::done;
}

// Pieces go to the client as they arrive. A replica that dies mid-stream leaves the client with an
// error event and [DONE], so OpenAI clients end cleanly instead of hanging. Success: the stream
// ended cleanly; failure: the replica broke it; unknown: the client left.
awaitable<Verdict> Gateway::relay_stream(http::HttpClient& client, const http::ResponseHead& head, ReplicaLink& link,
                                         http::ResponseWriter& w, double started, bool responses_events) {
  if (!co_await begin_client_stream(client, head, link.url, w)) co_return Verdict::unknown;
  bool first = true;
  bool broke = false;
  bool client_stalled = false;
  std::int64_t sequence = -1;  // a Responses stream: the last event's sequence_number relayed
  for (;;) {
    std::optional<std::string> piece;
    try {
      piece = co_await client.read_some();
    } catch (const std::exception&) {
      broke = true;
    }
    if (broke || !piece) break;
    if (first) {
      first = false;
      metrics_.histogram("kvfleet_router_ttft_seconds", "Time to the first streamed bytes from the replica",
                         latency_buckets())
          .Observe(seconds_now() - started);
    }
    if (responses_events) sequence = last_sequence_number(*piece, sequence);
    const auto write_started = std::chrono::steady_clock::now();
    if (!co_await w.write(*piece)) {
      client.close();
      co_return Verdict::unknown;
    }
    client_stalled |= std::chrono::steady_clock::now() - write_started >= kClientStall;
  }
  if (w.client_gone()) {
    client.close();
    co_return Verdict::unknown;
  }
  if (broke) {
    count_request(link.url, "upstream_error", &link);
    const std::string error = http::json_error_body("the replica failed mid-stream", "server_error", "", "upstream_error");
    const std::string event = responses_events
                                  ? responses_error_event(sequence + 1, "upstream_error", "the replica failed mid-stream")
                                  : http::sse_format(error) + "data: [DONE]\n\n";
    co_await w.write(event);
  } else {
    count_request(link.url, std::to_string(head.status), &link);
    metrics_.histogram("kvfleet_router_upstream_latency_seconds", "Time to the replica's whole answer", latency_buckets())
        .Observe(seconds_now() - started);
  }
  co_await w.finish();
  if (broke && client_stalled) co_return Verdict::unknown;  // the slow client may have caused it
  co_return broke ? Verdict::failure : Verdict::success;
}

}  // namespace kvfleet::router
