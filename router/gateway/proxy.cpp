// Admission, forwarding with retries, and relaying the replica's answer piece by piece.
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <random>

#include "kvfleet/http/json_error.h"
#include "kvfleet/http/sse.h"
#include "router/gateway/gateway.h"

namespace kvfleet::router {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

double seconds_now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

const std::vector<double>& latency_buckets() {
  static const std::vector<double> b{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return b;
}

// Request headers worth passing upstream (the rest are hop-by-hop or set by the client).
constexpr std::string_view kForwarded[] = {"content-type", "accept", "authorization", "x-request-id"};

awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_after(d);
  co_await timer.async_wait(asio::use_awaitable);
}

}  // namespace

// A free slot at once, or a place in the bounded queue until release_slot() hands one over (or
// queue_timeout passes). False: answer 429.
awaitable<bool> Gateway::admit() {
  auto waiter = std::make_shared<SlotWaiter>(co_await asio::this_coro::executor);
  waiter->timer.expires_after(config_.queue_timeout);
  {
    std::lock_guard lock(mutex_);
    if (active_ < config_.max_concurrency) {
      ++active_;
      co_return true;
    }
    if (waiters_.size() >= config_.max_queue) co_return false;
    waiters_.push_back(waiter);
  }
  boost::system::error_code ec;
  co_await waiter->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  std::lock_guard lock(mutex_);
  if (waiter->granted) co_return true;
  std::erase(waiters_, waiter);  // timed out (or the client left) before a slot came
  co_return false;
}

// The slot goes straight to the longest waiter, if any, so a burst cannot overtake the queue.
void Gateway::release_slot() {
  std::shared_ptr<SlotWaiter> next;
  {
    std::lock_guard lock(mutex_);
    if (waiters_.empty()) {
      --active_;
      return;
    }
    next = waiters_.front();
    waiters_.pop_front();
    next->granted = true;
  }
  asio::post(next->timer.get_executor(), [next] { next->timer.cancel(); });
}

awaitable<void> Gateway::proxy(const http::Request& req, http::ResponseWriter& w) {
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
  if (!co_await admit()) {
    metrics_.counter("kvfleet_router_rejected_total", "Requests refused with 429 (queue full)").Increment();
    co_await w.send(http::json_error(429, "too many requests in flight; retry later", "rate_limit_error"));
    co_return;
  }
  struct Admitted {  // gives the slot back however the handler ends
    Gateway& g;
    ~Admitted() { g.release_slot(); }
  } admitted{*this};

  const RoutePlan plan = this->plan(req.path(), body.as_object(), req);
  std::vector<ReplicaId> tried;
  std::minstd_rand jitter(static_cast<unsigned>(now_tick()));
  for (int attempt = 0; attempt < config_.max_attempts && !w.client_gone(); ++attempt) {
    std::shared_ptr<ReplicaLink> link = route(plan, tried);
    if (!link) break;
    if (attempt > 0) {
      metrics_.counter("kvfleet_router_retries_total", "Requests sent again to another replica").Increment();
      const auto base = config_.retry_backoff * (1 << std::min(attempt - 1, 6));
      const auto wait = base + std::chrono::milliseconds(jitter() % (base.count() + 1));
      co_await sleep_for(wait);
    }
    Outcome outcome = Outcome::done;
    std::exception_ptr error;
    try {
      outcome = co_await forward(*link, req, w);
    } catch (...) {
      error = std::current_exception();
    }
    release(*link, plan);
    if (error) std::rethrow_exception(error);
    if (outcome == Outcome::done) co_return;
    tried.push_back(link->slot);
  }
  if (w.client_gone()) co_return;
  count_request("none", "503");
  co_await w.send(http::json_error(503, "no replica could serve the request", "overloaded_error"));
}

// Done: the replica's answer (or an error event in its stream) reached the client, or the client
// left. Retry: nothing reached the client, so another replica may try.
awaitable<Gateway::Outcome> Gateway::forward(ReplicaLink& link, const http::Request& req, http::ResponseWriter& w) {
  const auto executor = co_await asio::this_coro::executor;
  http::HttpClientConfig cc;
  cc.connect_timeout = config_.connect_timeout;
  cc.io_timeout = config_.upstream_timeout;
  http::HttpClient client(executor, cc);
  // Closing the upstream connection aborts the request on the replica (and frees its blocks).
  w.on_disconnect([&client] { client.close(); });
  struct Unhook {  // the callback must not outlive `client`
    http::ResponseWriter& w;
    ~Unhook() { w.on_disconnect([] {}); }
  } unhook{w};

  http::Request upstream;
  upstream.method = req.method;
  upstream.target = req.target;
  upstream.body = req.body;
  for (const auto& name : kForwarded)
    if (const std::string* v = req.headers.find(name)) upstream.headers.set(name, *v);
  const double started = seconds_now();
  bool connected = false;
  bool failed = false;
  http::ResponseHead head;
  try {
    const std::string host = link.address.host;
    co_await client.connect(host, link.address.port);
    connected = true;
    co_await client.send(upstream);
    head = co_await client.read_head();
  } catch (const std::exception&) {
    failed = true;
  }
  if (failed) {
    if (w.client_gone()) co_return Outcome::done;
    note_failure(link, !connected);
    co_return Outcome::retry;
  }
  const std::string* type = head.headers.find("content-type");
  if (head.chunked || (type && type->find("text/event-stream") != std::string::npos)) {
    co_await relay_stream(client, head, link, w, started);
    co_return Outcome::done;
  }
  std::string body;
  try {
    body = co_await client.read_body();
  } catch (const std::exception&) {
    failed = true;
  }
  if (failed) {  // died before answering: nothing reached the client yet
    if (w.client_gone()) co_return Outcome::done;
    note_failure(link, false);
    co_return Outcome::retry;
  }
  metrics_.histogram("kvfleet_router_upstream_latency_seconds", "Time to the replica's whole answer", latency_buckets())
      .Observe(seconds_now() - started);
  count_request(link.url, std::to_string(head.status));
  http::Response response;
  response.status = head.status;
  response.body = std::move(body);
  response.headers.set("content-type", type ? *type : "application/json");
  response.headers.set("x-kvfleet-replica", link.url);
  co_await w.send(std::move(response));
  co_return Outcome::done;
}

// Pieces go to the client as they arrive. A replica that dies mid-stream leaves the client with an
// error event and [DONE], so OpenAI clients end cleanly instead of hanging.
awaitable<void> Gateway::relay_stream(http::HttpClient& client, const http::ResponseHead& head, ReplicaLink& link,
                                      http::ResponseWriter& w, double started) {
  http::Headers headers;
  const std::string* type = head.headers.find("content-type");
  headers.set("content-type", type ? *type : "text/event-stream");
  headers.set("cache-control", "no-cache");
  headers.set("x-kvfleet-replica", link.url);
  if (!co_await w.begin_stream(head.status, headers)) co_return;
  bool first = true;
  bool broke = false;
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
    if (!co_await w.write(*piece)) {
      client.close();
      co_return;
    }
  }
  if (w.client_gone()) co_return;
  if (broke) {
    note_failure(link, false);
    count_request(link.url, "upstream_error");
    const std::string error = http::json_error_body("the replica failed mid-stream", "server_error", "", "upstream_error");
    const std::string event = http::sse_format(error) + "data: [DONE]\n\n";
    co_await w.write(event);
  } else {
    count_request(link.url, std::to_string(head.status));
    metrics_.histogram("kvfleet_router_upstream_latency_seconds", "Time to the replica's whole answer", latency_buckets())
        .Observe(seconds_now() - started);
  }
  co_await w.finish();
}

}  // namespace kvfleet::router
