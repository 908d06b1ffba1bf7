// PrefillService's answer to a hello (POST /internal/prefill, prefill_service.h): the checks, the stream pin,
// the prefill_only request, the lease, and the accept once the first wanted block is computed.
#include <algorithm>

#include "engine/pd/prefill_service.h"
#include "engine/pd/ucx/transport.h"
#include "engine/pd/wire.h"
#include "kvfleet/http/json_error.h"

namespace kvfleet::pd {
using boost::asio::awaitable;

namespace {

// Reads the hello frame of a request body into `hello`; "" when it is one, else why it is not.
std::string decode_hello(std::string_view body, Hello& hello) {
  try {
    Frame f = decode_one(body);
    if (!std::holds_alternative<Hello>(f)) throw WireError(WireError::Kind::malformed, "expected a hello frame");
    hello = std::get<Hello>(std::move(f));
  } catch (const WireError& e) {
    return e.what();
  }
  return {};
}

http::Response frame_response(const Frame& f) {
  http::Response r;
  r.headers.set("Content-Type", "application/octet-stream");
  r.body = encode(f);
  return r;
}

}  // namespace

awaitable<void> PrefillService::handle_prefill(const http::Request& req, http::ResponseWriter& w) {
  Hello hello;
  const std::string bad_frame = decode_hello(req.body, hello);
  if (!bad_frame.empty()) {
    co_await w.send(http::json_error(400, "bad hello frame: " + bad_frame, "invalid_request_error", {}, "bad_frame"));
    co_return;
  }
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const BlockHash root = hello.cache_salt.empty() ? layout_.root : block_hash_root(layout_.model_name, hello.cache_salt);
  const std::vector<BlockHash> hashes = block_hashes(root, hello.tokens, bs);
  std::optional<http::Response> refused = check_hello(hello, hashes);
  if (refused) {
    co_await w.send(std::move(*refused));
    co_return;
  }
  const std::size_t first = hello.held.size();
  const auto [stream_pin, all_cached] = co_await pin_cached(hello.tokens, hashes, first);
  auto hold = std::make_shared<EnginePin>(engine_, stream_pin);  // unpins when no lease takes it
  auto queue = std::make_shared<Outputs>(co_await boost::asio::this_coro::executor);
  RequestId rid = 0;
  if (!all_cached) {
    std::string why;
    rid = submit_prefill(hello.tokens, hello.cache_salt, queue, why);
    if (!why.empty()) {
      co_await w.send(http::json_error(400, why, "invalid_request_error", {}, "prefill_failed"));
      co_return;
    }
    w.on_disconnect([this, rid] { engine_.abort(rid); });  // D left: stop computing for it
  }
  Accept a = make_accept(hello, hashes, first);
  a.transfer_id = open_lease(a, std::move(hold), std::move(hello.tokens), rid);
  co_await send_accept(a, rid, *queue, w);
}

std::optional<http::Response> PrefillService::check_hello(const Hello& hello, const std::vector<BlockHash>& hashes) const {
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  std::string problem, code = "bad_request";
  int status = 400;
  if (hello.version != kProtocolVersion) {
    status = 409, code = "protocol_version", problem = "protocol version " + std::to_string(hello.version) + " (this replica speaks 1)";
  } else if (hello.layout != layout_ || hello.compat_hash != compat_) {
    status = 409, code = "compat_mismatch";
    problem = "KV layouts differ: " + describe_mismatch(layout_, hello.layout);
    if (hello.layout == layout_) problem = "compatibility hashes differ";
  } else if (pick_transport(hello.transports, offered_transports()).empty()) {
    status = 409, code = "no_common_transport", problem = "no common transport (this replica offers " + offered_list() + ")";
  } else if (hello.cache_salt.size() > 256) {
    problem = "cache_salt longer than 256 bytes";
  } else if (hello.tokens.empty() || hello.tokens.size() % bs != 0) {
    problem = "tokens must be whole blocks of " + std::to_string(bs);
  } else if (hello.held.size() >= hashes.size() || !std::equal(hello.held.begin(), hello.held.end(), hashes.begin())) {
    problem = "held blocks must be a proper prefix of the prompt's blocks";
  }
  if (problem.empty()) return std::nullopt;
  return http::json_error(status, problem, http::error_type_for(status), {}, code);
}

// Every wanted block already in P's prefix cache (a prompt P served before): pin them all into the stream
// pin now and compute nothing. A prefill would recompute the last block (a prefix-cache hit stops one
// token short, for logits a prefill_only request never uses), which the profile showed running on P's
// engine next to the pulls: a third of the transfer's CPU in bench_pd_transfer.
awaitable<std::pair<PinId, bool>> PrefillService::pin_cached(const std::vector<TokenId>& tokens,
                                                             const std::vector<BlockHash>& hashes, std::size_t first) {
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  auto pin = [tokens, hashes, first, bs](Scheduler& s, Backend&) {
    std::vector<BlockId> have;
    for (std::size_t i = first; i < hashes.size(); ++i) {
      const BlockId b = s.kv().cached_block(hashes[i], std::span<const TokenId>(tokens).subspan(i * bs, bs));
      if (b == kNoBlock) return std::pair<PinId, bool>(s.kv().pin({}), false);
      have.push_back(b);
    }
    return std::pair<PinId, bool>(s.kv().pin(have), true);
  };
  co_return co_await on_engine_thread(engine_, std::move(pin));
}

RequestId PrefillService::submit_prefill(std::vector<TokenId> tokens, std::string cache_salt,
                                         std::shared_ptr<Outputs> queue, std::string& refused) {
  GenerationRequest g;
  g.prompt = std::move(tokens);
  g.cache_salt = std::move(cache_salt);
  g.prefill_only = true;
  g.max_tokens = 1;
  g.ignore_eos = true;
  try {
    return engine_.submit(std::move(g), [queue](const RequestOutput& o) { queue->push(o); });
  } catch (const std::invalid_argument& e) {
    refused = e.what();
  }
  return 0;
}

Accept PrefillService::make_accept(const Hello& hello, const std::vector<BlockHash>& hashes, std::size_t first) const {
  Accept a;
  a.layout = layout_;
  a.compat_hash = compat_;
  a.transport = pick_transport(hello.transports, offered_transports());
  if (a.transport == "ucx") a.transport_port = ucx_->port();
  a.lease_ms = static_cast<std::uint32_t>(
      hello.lease_ms > 0 ? std::min<std::int64_t>(hello.lease_ms, config_.lease.count()) : config_.lease.count());
  a.first_block = static_cast<std::uint32_t>(first);
  a.num_blocks = static_cast<std::uint32_t>(hashes.size() - first);
  a.hashes.assign(hashes.begin() + static_cast<std::ptrdiff_t>(a.first_block), hashes.end());
  return a;
}

std::uint64_t PrefillService::open_lease(const Accept& a, std::shared_ptr<EnginePin> hold, std::vector<TokenId> tokens,
                                         RequestId prefill) {
  std::lock_guard lock(mu_);
  const std::uint64_t id = next_id_++;
  Lease& l = leases_[id];
  l.pin = hold->id();
  l.hold = std::move(hold);
  l.first = a.first_block, l.count = a.num_blocks, l.hashes = a.hashes;
  l.ttl = std::chrono::milliseconds(a.lease_ms), l.deadline = Clock::now() + l.ttl;
  l.tokens = std::make_shared<const std::vector<TokenId>>(std::move(tokens));
  l.prefill = prefill;
  return id;
}

// The accept goes out once the first wanted block is computed (D's pulls then wait for one engine step at
// a time, not for a queue), or once the prefill ended; meanwhile D leaving aborts the prefill.
awaitable<void> PrefillService::send_accept(const Accept& a, RequestId prefill, Outputs& outputs,
                                            http::ResponseWriter& w) {
  std::optional<RequestOutput> out;
  const std::function<bool()> ended = [&] {  // (a named std::function: GCC 12, see client.h)
    while (auto o = outputs.try_pop())
      if (o->finished) out = std::move(*o);
    return out.has_value() || w.client_gone();
  };
  co_await wait_ready(a.transfer_id, a.first_block, a.first_block + 1, ended);
  w.on_disconnect([] {});
  if (out && out->pin == 0) {
    release(a.transfer_id);
    co_await w.send(http::json_error(503, "the prefill did not complete: " + out->error, "overloaded_error", {}, "prefill_failed"));
    co_return;
  }
  if (out) prefill_done(a.transfer_id, *out);
  bool sent = !w.client_gone();
  if (sent) sent = co_await w.send(frame_response(a));
  if (!sent) {
    release(a.transfer_id);
    co_return;
  }
  while (prefill != 0 && !out) {  // follow the prefill to its end (the lease ending first aborts it)
    auto o = co_await outputs.pop();
    if (!o) break;
    if (o->finished) out = std::move(*o);
  }
  if (out) prefill_done(a.transfer_id, *out);
}

}  // namespace kvfleet::pd
