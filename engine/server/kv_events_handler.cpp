// GET /v1/kv_events?since=SEQ (Contract 2): a long-lived SSE stream of the prefix cache's changes. It opens
// with a config event (block size and hash root, so the router can check it hashes the same way), replays
// what the ring still holds after `since` (or sends `cleared` plus a snapshot when the reader fell behind),
// then follows new events until the client leaves or the replica drains.
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <charconv>

#include "engine/server/api_request.h"
#include "engine/server/replica.h"

namespace kvfleet::server {
namespace json = boost::json;
using boost::asio::awaitable;

namespace {

std::string event_line(const KvEvent& e, const char* tier) {
  json::object o{{"seq", e.seq}, {"type", to_string(e.type)}, {"tier", tier}};
  json::array hashes;
  for (BlockHash h : e.block_hashes) hashes.emplace_back(h);
  o["block_hashes"] = std::move(hashes);
  if (e.type == KvEvent::Type::stored) o["parent"] = e.parent;
  return "data: " + json::serialize(o) + "\n\n";
}

}  // namespace

awaitable<void> Replica::kv_events(const http::Request& req, http::ResponseWriter& w) {
  std::uint64_t since = 0;
  if (const auto s = req.query_param("since")) {
    const auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), since);
    if (ec != std::errc() || p != s->data() + s->size()) throw bad_request("'since' must be a sequence number", "since");
  }
  const auto ring = engine_->kv_events();
  const char* tier = config_.engine.backend.kind == "cuda" ? "gpu" : "cpu";
  http::Headers sse_headers{{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}};
  if (!co_await w.begin_stream(200, std::move(sse_headers))) co_return;
  const json::object config{{"type", "config"}, {"seq", ring->last_seq()}, {"block_size", ring->block_size()},
                            {"root", ring->root()}, {"model", name_}};
  const std::string opening = "data: " + json::serialize(config) + "\n\n";
  if (!co_await w.write(opening)) co_return;

  KvReplay replay = ring->since(since);
  if (replay.fell_behind) {
    // Start over: everything cached now, as one `cleared` and then stored events, parents first.
    const KvSnapshot snap = engine_->kv_snapshot();
    std::string out = event_line({snap.seq, KvEvent::Type::cleared, {}, 0}, tier);
    for (const auto& b : snap.blocks) out += event_line({snap.seq, KvEvent::Type::stored, {b.hash}, b.parent}, tier);
    if (!co_await w.write(out)) co_return;
    since = snap.seq;
    replay = ring->since(since);
  }
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  while (!w.client_gone() && !draining_) {
    if (replay.fell_behind) co_return;  // lost events: the router reconnects and gets a snapshot
    std::string out;
    for (const KvEvent& e : replay.events) {
      out += event_line(e, tier);
      since = e.seq;
    }
    if (!out.empty() && !co_await w.write(out)) co_return;
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(boost::asio::use_awaitable);
    replay = ring->since(since);
  }
  co_await w.finish();
}

}  // namespace kvfleet::server
