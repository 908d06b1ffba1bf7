// GET /v1/kv_events?since=SEQ (Contract 2): a long-lived SSE stream of the prefix cache's changes. It opens
// with a config event (block size, hash root and this process's instance id, so the router can check it
// hashes the same way and tell a restart), replays what the ring still holds after `since` (or sends
// `cleared` plus a snapshot when the reader fell behind), then follows new events until the client leaves
// or the replica drains, with a `: ping` comment after each heartbeat period without output.
//
// With `load=1` (a router that balances on the replica's own load) the stream also carries
// `{"type":"load","waiting":W,"running":R,"kv_usage":U}` (no seq: not a cache event) when it opens,
// whenever the engine's figures change (looked at every kLoadPoll) and at least every heartbeat, in
// place of the ping. Only readers that ask get it: older routers took an unknown type for bad JSON.
//
// With `snapshot=1` and since=0 (a reader that has nothing yet, e.g. a router started late) the stream
// starts from `cleared` + a snapshot even when the ring could replay from seq 1: the snapshot is the
// cache as it is, the replay its whole history (every block stored and evicted since the start).
//
// With `per_rank=1` on an expert-parallel replica (--ep-size N > 1) the stream is EpGroup's per-rank ring:
// each rank's own stored/removed events with its dp_rank (the default union stream announces a block only
// for its first holder and its removal only by the last, which hides which ranks hold it), a snapshot of
// each rank's cache, and one `load` event per rank (with dp_rank). The config event then says
// `"per_rank":true`; it carries `"dp_size":N` on every expert-parallel replica. A router keeps one tree
// per (replica, rank) from it and names the rank it picks (X-data-parallel-rank). Without ranks the
// parameter changes nothing.
//
// Nothing here blocks an io thread: the coroutine sleeps on a timer that the ring's listener (engine
// thread) cancels when it publishes, and the snapshot is asked of the engine asynchronously.
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <mutex>

#include "engine/server/api/request.h"
#include "engine/server/replica.h"

namespace kvfleet::server {
namespace json = boost::json;
namespace asio = boost::asio;
using boost::asio::awaitable;

namespace {

constexpr std::size_t kEventsPerWrite = 256;  // a snapshot or a long replay goes out in pieces
constexpr std::chrono::milliseconds kLoadPoll{200};

std::string load_line(const EngineStats& stats, int dp_rank = -1) {
  const double usage = std::round(std::clamp(stats.scheduler.kv.usage, 0.0, 1.0) * 1000) / 1000;  // 0.1% steps
  json::object o{{"type", "load"},
                 {"waiting", std::max(0, stats.scheduler.num_waiting)},
                 {"running", std::max(0, stats.scheduler.num_running)},
                 {"kv_usage", usage}};
  if (dp_rank >= 0) o["dp_rank"] = dp_rank;
  return "data: " + json::serialize(o) + "\n\n";
}

std::string event_line(const KvEvent& e, const char* tier, bool snapshot = false) {
  json::object o{{"seq", e.seq}, {"type", to_string(e.type)}, {"tier", tier}};
  json::array hashes;
  for (BlockHash h : e.block_hashes) hashes.emplace_back(h);
  o["block_hashes"] = std::move(hashes);
  if (e.type == KvEvent::Type::stored) o["parent"] = e.parent;
  if (snapshot) o["snapshot"] = true;
  if (e.dp_rank >= 0) o["dp_rank"] = e.dp_rank;  // an expert-parallel replica's merged stream (additive)
  if (e.medium != KvMedium::device) o["medium"] = to_string(e.medium);  // a KV tier below the device pool
  return "data: " + json::serialize(o) + "\n\n";
}

// Wakes the stream's coroutine from another thread: `pending` is set and the timer the coroutine sleeps
// on is cancelled on the coroutine's executor. A wake-up while it is not sleeping stays in `pending`.
struct StreamWaker {
  explicit StreamWaker(asio::any_io_executor executor) : timer(std::move(executor)) {}
  asio::steady_timer timer;
  std::atomic<bool> pending{false};
  std::mutex mu;
  std::optional<KvSnapshot> snapshot;  // guarded by mu: the engine's answer
};

void wake(const std::shared_ptr<StreamWaker>& w) {
  if (!w->pending.exchange(true)) asio::post(w->timer.get_executor(), [w] { w->timer.cancel(); });
}

// Sleeps until woken or `timeout` passes; true when woken.
awaitable<bool> sleep_until_woken(StreamWaker& w, std::chrono::milliseconds timeout) {
  if (w.pending.exchange(false)) co_return true;
  w.timer.expires_after(timeout);
  boost::system::error_code ec;
  co_await w.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  co_return w.pending.exchange(false);
}

}  // namespace

awaitable<void> Replica::kv_events(const http::Request& req, http::ResponseWriter& w) {
  std::uint64_t since = 0;
  const auto load_param = req.query_param("load");
  const bool want_load = load_param && (*load_param == "1" || *load_param == "true");
  const auto snapshot_param = req.query_param("snapshot");
  const bool want_snapshot = snapshot_param && (*snapshot_param == "1" || *snapshot_param == "true");
  const auto per_rank_param = req.query_param("per_rank");
  const bool per_rank = ep_ && per_rank_param && (*per_rank_param == "1" || *per_rank_param == "true");
  if (const auto s = req.query_param("since")) {
    const auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), since);
    if (ec != std::errc() || p != s->data() + s->size()) throw bad_request("'since' must be a sequence number", "since");
  }
  // An EP group: the ranks' union, or each rank's own events (per_rank=1).
  const auto ring = !ep_ ? engine_->kv_events() : per_rank ? ep_->kv_events_per_rank() : ep_->kv_events();
  // The backend the engine runs on (under --backend auto, the one make_backend chose), not the flag.
  const char* tier = chosen_backend_kind(config_.engine.backend) == "cuda" ? "gpu" : "cpu";
  const auto heartbeat = config_.kv_events_heartbeat;
  auto waker = std::make_shared<StreamWaker>(co_await asio::this_coro::executor);
  const std::shared_ptr<void> subscription = ring->subscribe([waker] { wake(waker); });
  w.on_disconnect([waker] {
    waker->pending = true;
    waker->timer.cancel();
  });
  struct UnhookDisconnectWaker {  // the callback must not outlive this frame's use of the writer
    http::ResponseWriter& w;
    ~UnhookDisconnectWaker() { w.on_disconnect([] {}); }
  } unhook_waker{w};

  http::Headers sse_headers{{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}};
  if (!co_await w.begin_stream(200, std::move(sse_headers))) co_return;
  json::object config{{"type", "config"},           {"seq", ring->last_seq()}, {"block_size", ring->block_size()},
                      {"root", ring->root()},       {"model", name_},          {"instance", ring->instance()},
                      {"heartbeat_ms", heartbeat.count()}};
  if (ep_) config["dp_size"] = ep_->size();
  if (per_rank) config["per_rank"] = true;
  // Replicas naming the same shared KV tier read each other's blocks there (routers count them for each).
  if (!ep_)
    if (const std::uint64_t shared = engine_->stats().kv_tiers.shared_tier_id; shared != 0) config["shared_tier"] = shared;
  const std::string opening = "data: " + json::serialize(config) + "\n\n";
  if (!co_await w.write(opening)) co_return;

  KvReplay replay = ring->since(since);
  if (want_snapshot && since == 0 && replay.last_seq > 0) replay.fell_behind = true;
  if (replay.fell_behind) {
    // Start over: everything cached now, as one `cleared` naming the count and then that many stored
    // events at the same seq, parents first (the router applies them all).
    auto deliver = [waker](KvSnapshot snap) {
      {
        std::lock_guard lock(waker->mu);
        waker->snapshot = std::move(snap);
      }
      wake(waker);
    };
    std::vector<std::int32_t> ranks;  // per_rank: each snapshot block's rank
    if (per_rank) {
      const EpGroup::RankedSnapshot ranked = ep_->kv_snapshot_per_rank();
      KvSnapshot plain;
      plain.seq = ranked.seq;
      for (const auto& b : ranked.blocks) {
        plain.blocks.push_back({b.hash, b.parent});
        ranks.push_back(b.dp_rank);
      }
      deliver(std::move(plain));
    } else if (ep_) {
      deliver(ep_->kv_snapshot());  // the group's own state, consistent with its ring
    } else {
      engine_->kv_snapshot(deliver);
    }
    std::optional<KvSnapshot> snap;
    while (!snap) {
      {
        std::lock_guard lock(waker->mu);
        snap.swap(waker->snapshot);
      }
      if (snap) break;
      if (w.client_gone() || draining_) co_return;
      if (!co_await sleep_until_woken(*waker, heartbeat) && !co_await w.write(": ping\n\n")) co_return;
    }
    json::object cleared{{"seq", snap->seq}, {"type", "cleared"}, {"tier", tier}, {"snapshot", snap->blocks.size()}};
    std::string out = "data: " + json::serialize(cleared) + "\n\n";
    for (std::size_t i = 0; i < snap->blocks.size(); ++i) {
      const auto& b = snap->blocks[i];
      out += event_line({snap->seq, KvEvent::Type::stored, {b.hash}, b.parent, i < ranks.size() ? ranks[i] : -1, b.medium},
                        tier, true);
      if ((i + 1) % kEventsPerWrite == 0) {
        if (!co_await w.write(out)) co_return;
        out.clear();
      }
    }
    if (!out.empty() && !co_await w.write(out)) co_return;
    since = snap->seq;
    replay = ring->since(since);
  }
  std::string last_load;
  auto last_load_at = std::chrono::steady_clock::now();
  while (!w.client_gone() && !draining_) {
    if (replay.fell_behind) co_return;  // lost events: the router reconnects and gets a snapshot
    std::string out;
    for (std::size_t i = 0; i < replay.events.size(); ++i) {
      out += event_line(replay.events[i], tier);
      since = replay.events[i].seq;
      if ((i + 1) % kEventsPerWrite == 0 || i + 1 == replay.events.size()) {
        if (!co_await w.write(out)) co_return;
        out.clear();
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (want_load) {
      // An EP group: the whole group's figures, or one line per rank (per_rank=1).
      std::string line;
      if (per_rank)
        for (int r = 0; r < ep_->size(); ++r) line += load_line(ep_->rank_stats(r), r);
      else
        line = load_line(ep_ ? ep_->stats() : engine_->stats());
      if (line != last_load || now - last_load_at >= heartbeat) {
        if (!co_await w.write(line)) co_return;
        last_load = std::move(line);
        last_load_at = now;
      }
    }
    const bool woken = co_await sleep_until_woken(*waker, want_load ? std::min(heartbeat, kLoadPoll) : heartbeat);
    if (!woken && !want_load && !w.client_gone() && !co_await w.write(": ping\n\n")) co_return;
    replay = ring->since(since);
  }
  co_await w.finish();
}

}  // namespace kvfleet::server
