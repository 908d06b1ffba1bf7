// Per replica, on its strand: active health checks, and the KV event subscription (exact mode).
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <random>

#include "kvfleet/http/sse.h"
#include "router/gateway/gateway.h"

namespace kvfleet::router {
namespace asio = boost::asio;
using std::chrono::milliseconds;

namespace {

awaitable<void> sleep_for(milliseconds d) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_after(d);
  co_await timer.async_wait(asio::use_awaitable);
}

}  // namespace

void Gateway::start_loops(const std::shared_ptr<ReplicaLink>& link) {
  asio::co_spawn(link->strand, health_loop(link), asio::detached);
  if (config_.kv_events) asio::co_spawn(link->strand, events_loop(link), asio::detached);
}

awaitable<void> Gateway::health_loop(std::shared_ptr<ReplicaLink> link) {
  const auto executor = co_await asio::this_coro::executor;
  while (!link->removed && !stopping_) {
    bool ok = false;
    try {
      http::HttpClientConfig cc;
      cc.connect_timeout = config_.health_timeout;
      cc.io_timeout = config_.health_timeout;
      http::HttpClient client(executor, cc);
      const std::string host = link->address.host;
      co_await client.connect(host, link->address.port);
      http::Request req;
      req.method = "GET";
      req.target = "/health";
      const http::Response r = co_await client.request(req);
      ok = r.status == 200;
    } catch (const std::exception&) {
      ok = false;
    }
    if (link->removed) break;
    record_health(*link, ok);
    co_await sleep_for(config_.health_interval);
  }
}

// Reconnects with exponential backoff (100 ms to 5 s, with jitter); a replica without the endpoint
// (404) is asked again only every 30 s and stays approximate meanwhile.
awaitable<void> Gateway::events_loop(std::shared_ptr<ReplicaLink> link) {
  const auto executor = co_await asio::this_coro::executor;
  std::minstd_rand jitter(link->slot * 7919u + 1);
  milliseconds backoff{100};
  while (!link->removed && !stopping_) {
    std::uint64_t since = 0;
    {
      std::lock_guard lock(mutex_);
      if (link->removed) break;
      since = index_.begin_stream(link->slot);
    }
    http::HttpClientConfig cc;
    cc.connect_timeout = config_.connect_timeout;
    cc.io_timeout = milliseconds(24LL * 3600 * 1000);  // an idle replica sends nothing for a long time
    link->events_client = std::make_shared<http::HttpClient>(executor, cc);
    std::string why = "stream ended";
    bool resync = false;
    bool unsupported = false;
    try {
      http::HttpClient& client = *link->events_client;
      const std::string host = link->address.host;
      co_await client.connect(host, link->address.port);
      http::Request req;
      req.method = "GET";
      req.target = "/v1/kv_events?since=" + std::to_string(since);
      req.headers.set("accept", "text/event-stream");
      co_await client.send(req);
      const http::ResponseHead head = co_await client.read_head();
      if (head.status != 200) {
        unsupported = true;
        why = "GET /v1/kv_events answered " + std::to_string(head.status);
      } else {
        resync = co_await read_events(*link, client);
        if (resync) why = "resync";
      }
    } catch (const boost::system::system_error& e) {
      why = "event stream failed: " + e.code().message();
    } catch (const std::exception& e) {
      why = std::string("event stream failed: ") + e.what();
    }
    link->events_client.reset();
    {
      std::lock_guard lock(mutex_);
      if (link->removed) break;
      index_.end_stream(link->slot, why);
      link->events_supported = !unsupported;
    }
    if (resync) {
      backoff = milliseconds(100);
      continue;
    }
    const milliseconds wait = unsupported ? milliseconds(30'000) : backoff + milliseconds(jitter() % (backoff.count() + 1));
    backoff = std::min(backoff * 2, milliseconds(5'000));
    co_await sleep_for(wait);
  }
}

// Feeds the stream into the index until it ends; true when the index asked for a resync (a seq
// gap, a malformed event), false when the stream simply ended.
awaitable<bool> Gateway::read_events(ReplicaLink& link, http::HttpClient& client) {
  http::SseParser parser;
  while (std::optional<std::string> piece = co_await client.read_some()) {
    for (const http::SseEvent& event : parser.feed(*piece)) {
      if (event.data.empty()) continue;
      EventOutcome outcome;
      bool removed = false;
      {
        std::lock_guard lock(mutex_);
        removed = link.removed;
        if (!removed) outcome = index_.apply_event(link.slot, event.data, now_tick());
        if (outcome.status == EventStatus::applied) link.events_applied += 1;
      }
      if (removed) co_return false;
      if (outcome.status == EventStatus::resync_needed) co_return true;
      if (outcome.status == EventStatus::config_rejected) {
        std::fprintf(stderr, "kvfleet-router: %s: %s\n", link.url.c_str(), outcome.message.c_str());
        co_return false;
      }
    }
  }
  co_return false;
}

}  // namespace kvfleet::router
