// Per replica: active health checks (on its health strand, the gateway's health thread), and the KV event
// subscription (exact mode, on its strand).
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <random>

#include <boost/json.hpp>

#include "kvfleet/http/sse.h"
#include "router/gateway/gateway.h"

namespace kvfleet::router {
namespace asio = boost::asio;
using std::chrono::milliseconds;

namespace {

// A replica's /health answer is small; the KV event stream's events are bounded (kv_event.h) and so is
// what the router applies under its lock at once.
constexpr std::size_t kHealthBodyLimit = 64 * 1024;
constexpr std::size_t kHeadLimit = 16 * 1024;
constexpr std::size_t kMaxEventBytes = 4 << 20;  // one SSE event (a full kMaxEventHashes event is ~1.4 MB)
constexpr std::size_t kApplyBatch = 1024;        // hashes applied per hold of the routing lock
constexpr milliseconds kMinBackoff{100}, kMaxBackoff{5'000};

// Sleeps on the link's own timer, so that ReplicaLink::stop_io() can cut the sleep short (no exception then).
awaitable<void> sleep_for(asio::steady_timer& timer, milliseconds d) {
  timer.expires_after(d);
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

}  // namespace

// loops_ counts them, so that shutdown can wait until each has ended (finish_loops).
void Gateway::start_loops(const std::shared_ptr<ReplicaLink>& link) {
  auto done = [this](const std::exception_ptr&) { loops_ -= 1; };
  loops_ += 1;
  asio::co_spawn(link->health_strand, health_loop(link), done);
  if (!config_.kv_events) return;
  loops_ += 1;
  asio::co_spawn(link->strand, events_loop(link), done);
}

awaitable<void> Gateway::health_loop(std::shared_ptr<ReplicaLink> link) {
  const auto executor = co_await asio::this_coro::executor;
  while (!link->removed && !stopping_) {
    bool ok = false;
    try {
      http::HttpClientConfig cc;
      cc.connect_timeout = config_.health_timeout;
      cc.io_timeout = config_.health_timeout;
      cc.header_limit = kHeadLimit;
      cc.body_limit = kHealthBodyLimit;
      link->health_client = std::make_shared<http::HttpClient>(executor, cc);
      http::HttpClient& client = *link->health_client;
      const std::string host = link->address.host;
      co_await client.connect(host, link->address.port);
      http::Request req;
      req.method = "GET";
      req.target = "/health";
      add_replica_auth(req);
      const http::Response r = co_await client.request(req);
      ok = r.status == 200;
      if (ok && !link->models_read) co_await read_max_model_len(*link);  // once: for the router's /v1/models
    } catch (const std::exception&) {
      ok = false;
    }
    link->health_client.reset();
    if (link->removed || stopping_) break;
    record_health(*link, ok);
    co_await sleep_for(link->health_timer, config_.health_interval);
  }
}

// GET /v1/models on the health check's connection (kept alive): the replica's max_model_len. Asked until
// it answers 200 once (a replica that does not say is not asked again); its failures are not health's.
awaitable<void> Gateway::read_max_model_len(ReplicaLink& link) {
  http::Request req;
  req.method = "GET";
  req.target = "/v1/models";
  add_replica_auth(req);
  std::optional<std::int64_t> len;
  bool answered = false;
  try {
    const http::Response r = co_await link.health_client->request(req);
    answered = r.status == 200;
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(r.body, ec);
    if (answered && !ec && v.is_object())
      if (const auto* data = v.as_object().if_contains("data"); data && data->is_array() && !data->as_array().empty())
        if (const auto* m = data->as_array()[0].if_object())
          if (const auto* n = m->if_contains("max_model_len"); n && n->is_int64() && n->as_int64() > 0) len = n->as_int64();
  } catch (const std::exception&) {
  }
  std::lock_guard lock(mutex_);
  link.models_read = answered;
  if (len) link.max_model_len = len;
}

void Gateway::add_replica_auth(http::Request& req) const {
  if (!config_.replica_api_key.empty()) req.headers.set("authorization", "Bearer " + config_.replica_api_key);
}

// Reconnects with exponential backoff and jitter (100 ms doubling to 5 s). The backoff starts over
// only after a stream that applied events; a replica that sends bad JSON, oversized events, errors or
// nothing useful is asked again ever more slowly. A replica
// without the endpoint (404) is asked again only every 30 s and stays approximate meanwhile.
awaitable<void> Gateway::events_loop(std::shared_ptr<ReplicaLink> link) {
  const auto executor = co_await asio::this_coro::executor;
  std::minstd_rand jitter(link->slot * 7919u + 1);
  milliseconds backoff = kMinBackoff;
  while (!link->removed && !stopping_) {
    std::uint64_t since = 0;
    {
      std::lock_guard lock(mutex_);
      if (link->removed) break;
      since = index_.begin_stream(link->slot);
    }
    http::HttpClientConfig cc;
    cc.connect_timeout = config_.connect_timeout;
    cc.io_timeout = config_.kv_events_timeout;  // heartbeats every few seconds keep a live stream inside it
    cc.header_limit = kHeadLimit;
    link->events_client = std::make_shared<http::HttpClient>(executor, cc);
    StreamEnd end;
    bool unsupported = false;
    bool streaming = false;  // the head was read: a timeout from here on is the stream falling silent
    try {
      http::HttpClient& client = *link->events_client;
      const std::string host = link->address.host;
      co_await client.connect(host, link->address.port);
      http::Request req;
      req.method = "GET";
      // load=1: the replica also reports its queue and KV usage (`load` events; older ones ignore it).
      // snapshot=1 from 0: the cache as it is rather than its whole history (older replicas replay).
      // per_rank=1: an expert-parallel replica sends each rank's own events (with dp_rank), so that each
      // (replica, rank) is a target of its own; others ignore it.
      req.target = "/v1/kv_events?since=" + std::to_string(since) + "&load=1&per_rank=1" + (since == 0 ? "&snapshot=1" : "");
      req.headers.set("accept", "text/event-stream");
      add_replica_auth(req);
      co_await client.send(req);
      const http::ResponseHead head = co_await client.read_head();
      if (head.status != 200) {
        unsupported = head.status == 404;
        end.why = "GET /v1/kv_events answered " + std::to_string(head.status);
      } else {
        streaming = true;
        end = co_await read_events(*link, client);
      }
    } catch (const boost::system::system_error& e) {
      // A replica sends `: ping` every few seconds: silence past kv_events_timeout means it is gone or
      // too old to send heartbeats: approximate mode until the stream, opened again, brings a config.
      end.why = streaming && e.code() == boost::beast::error::timeout
                    ? "no event or heartbeat for " + std::to_string(config_.kv_events_timeout.count()) +
                          " ms (kv_events_timeout_ms): reconnecting"
                    : "event stream failed: " + e.code().message();
    } catch (const std::exception& e) {
      end.why = std::string("event stream failed: ") + e.what();
    }
    link->events_client.reset();
    if (stopping_) break;
    {
      std::lock_guard lock(mutex_);
      if (link->removed) break;
      index_.end_stream(link->slot, end.why);
      link->load_reported = false;
      for (RankTarget& t : link->ranks) t.load_reported = false;
    }
    if (end.worked) backoff = kMinBackoff;
    // Full jitter: uniform in [backoff / 2, backoff].
    const milliseconds wait = unsupported ? milliseconds(30'000)
                                          : backoff / 2 + milliseconds(jitter() % (backoff.count() / 2 + 1));
    if (!end.worked) backoff = std::min(backoff * 2, kMaxBackoff);
    co_await sleep_for(link->events_timer, wait);
  }
}

// Feeds the stream into the index until it ends. Events are parsed outside the routing lock and
// applied in pieces of kApplyBatch hashes, so a huge event does not hold up routing.
awaitable<Gateway::StreamEnd> Gateway::read_events(ReplicaLink& link, http::HttpClient& client) {
  http::SseParser parser;
  StreamEnd end;
  bool accepted = false;
  std::size_t event_bytes = 0;  // bytes read since the last complete event (an upper bound)
  while (std::optional<std::string> piece = co_await client.read_some()) {
    std::vector<http::SseEvent> events = parser.feed(*piece);
    event_bytes = events.empty() ? event_bytes + piece->size() : piece->size();
    if (event_bytes > kMaxEventBytes + http::HttpClientConfig{}.piece_size) {
      end.why = "an event over " + std::to_string(kMaxEventBytes) + " bytes";
      co_return end;
    }
    for (const http::SseEvent& event : events) {
      if (event.data.empty()) continue;
      KvEventMessage message;
      try {
        message = parse_kv_event(event.data);
      } catch (const std::invalid_argument& e) {
        end.why = std::string("malformed event: ") + e.what();
        co_return end;  // what it said is lost: reconnect (with backoff) and replay from the last seq
      }
      if (message.type == KvEventMessage::Type::load) {
        std::lock_guard lock(mutex_);
        note_load_locked(link, message);
        continue;
      }
      if (message.type == KvEventMessage::Type::config) {
        std::lock_guard lock(mutex_);
        if (link.removed) co_return end;
        try {
          set_ranks_locked(link, message);
        } catch (const std::out_of_range& e) {
          end.why = e.what();  // no slots for its ranks: it stays approximate, asked again with backoff
          co_return end;
        }
      }
      if (message.type == KvEventMessage::Type::unknown) continue;  // a newer replica's event
      for (const KvEventMessage& part : split_kv_event(std::move(message), kApplyBatch)) {
        EventOutcome outcome;
        {
          std::lock_guard lock(mutex_);
          if (link.removed) co_return end;
          outcome = index_.apply_event(link.slot, part, now_tick());
          if (outcome.status == EventStatus::applied) link.events_applied += 1;
        }
        if (outcome.status == EventStatus::config_accepted) accepted = true;
        if (outcome.status == EventStatus::applied && accepted) end.worked = true;
        if (outcome.status == EventStatus::resync_needed) {
          end.why = "resync: " + outcome.message;
          co_return end;
        }
        if (outcome.status == EventStatus::config_rejected) {
          std::fprintf(stderr, "kvfleet-router: %s: %s\n", link.url.c_str(), outcome.message.c_str());
          end.why = outcome.message;
          co_return end;
        }
      }
    }
  }
  end.why = "stream ended";
  co_return end;
}

// A rank's load (per_rank stream) goes to that rank; one without dp_rank, or for a rank the link does not
// have, to the replica.
void Gateway::note_load_locked(ReplicaLink& link, const KvEventMessage& m) {
  const Tick now = now_tick();
  if (m.dp_rank >= 0 && static_cast<std::size_t>(m.dp_rank) < link.ranks.size()) {
    RankTarget& t = link.ranks[static_cast<std::size_t>(m.dp_rank)];
    t.load_reported = true;
    t.reported_waiting = m.waiting;
    t.reported_running = m.running;
    t.reported_kv_usage = m.kv_usage;
    t.load_at = now;
    return;
  }
  link.load_reported = true;
  link.reported_waiting = m.waiting;
  link.reported_running = m.running;
  link.reported_kv_usage = m.kv_usage;
  link.load_at = now;
}

// Ranks only from a per-rank stream (a union stream's dp_rank says where a block was first stored, not
// who holds it). The same shape keeps the ranks' counters; a new one starts them over.
void Gateway::set_ranks_locked(ReplicaLink& link, const KvEventMessage& config) {
  const std::uint32_t n = config.per_rank ? config.dp_size : 1;
  const std::vector<ReplicaId> slots = index_.set_ranks(link.slot, n);
  if (slots.size() == link.ranks.size()) return;
  link.ranks.assign(slots.size(), RankTarget{});
  for (std::size_t k = 0; k < slots.size(); ++k) link.ranks[k].slot = slots[k];
  link.most_ranks = std::max(link.most_ranks, static_cast<std::uint32_t>(slots.size()));
}

}  // namespace kvfleet::router
