#include "engine/pd/decode_fetcher.h"

#include <boost/beast/core/error.hpp>
#include <boost/system/system_error.hpp>
#include <chrono>
#include <cstdio>

#include "engine/pd/pull_reader.h"
#include "kvfleet/http/client.h"

namespace kvfleet::pd {
using boost::asio::awaitable;
using Clock = std::chrono::steady_clock;

namespace {

std::string reason_of(const boost::system::system_error& e, bool client_gone) {
  if (client_gone) return "client_gone";
  const auto ec = e.code();
  if (ec == boost::beast::error::timeout || ec == boost::asio::error::timed_out) return "timeout";
  return "peer_closed";
}

std::string wire_reason(const WireError& e) { return e.kind == WireError::Kind::checksum ? "checksum" : "malformed"; }

}  // namespace

bool parse_peer_url(std::string_view url, std::string& host, std::uint16_t& port) {
  if (url.starts_with("http://")) url.remove_prefix(7);
  if (url.ends_with("/")) url.remove_suffix(1);
  const auto colon = url.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == url.size() || url.size() - colon > 6) return false;
  unsigned value = 0;
  for (const char c : url.substr(colon + 1)) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value == 0 || value > 65535 || url.substr(0, colon).find('/') != std::string_view::npos) return false;
  host = std::string(url.substr(0, colon));
  port = static_cast<std::uint16_t>(value);
  return true;
}

awaitable<FetchResult> DecodeFetcher::fetch(std::span<const TokenId> prompt, std::string prefill_url,
                                            http::ResponseWriter& client, std::string cache_salt,
                                            std::string traceparent) {
  FetchResult result;
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const std::size_t wanted = prompt.empty() ? 0 : (prompt.size() - 1) / bs;
  result.wanted_blocks = static_cast<std::uint32_t>(wanted);
  if (wanted == 0) co_return result;  // shorter than a block + 1 token: nothing to ship
  Plan plan;
  plan.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(wanted * bs));
  plan.root = cache_salt.empty() ? layout_.root : block_hash_root(layout_.model_name, cache_salt);
  plan.cache_salt = std::move(cache_salt);
  plan.traceparent = std::move(traceparent);
  plan.hashes = block_hashes(plan.root, plan.tokens, bs);
  // Pin the leading blocks D holds, so they cannot be evicted before the request is admitted.
  // (Lambdas are named before a co_await: GCC 12 destroys a temporary in a co_await expression twice.)
  auto pin_held = [tokens = plan.tokens, hashes = plan.hashes, bs](Scheduler& s, Backend&) {
    std::vector<BlockId> have;
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      const BlockId b = s.kv().cached_block(hashes[i], std::span<const TokenId>(tokens).subspan(i * bs, bs));
      if (b == kNoBlock) break;
      have.push_back(b);
    }
    return std::pair<PinId, std::uint32_t>(s.kv().pin(have), static_cast<std::uint32_t>(have.size()));
  };
  const auto [pin, held] = co_await on_engine_thread(engine_, std::move(pin_held));
  result.pin = EnginePin(engine_, pin);
  plan.pin = pin;
  plan.held = result.held_blocks = held;
  if (held == wanted) co_return result;
  const auto start = Clock::now();
  plan.deadline = start + config_.transfer_timeout;
  try {
    if (!parse_peer_url(prefill_url, plan.host, plan.port)) throw PdFailure("connect", "bad prefill URL '" + prefill_url + "'");
    client.on_disconnect([&plan] {
      plan.client_gone = true;
      if (plan.active) plan.active->close();
      if (plan.ucx_active) plan.ucx_active->close();
    });
    co_await transfer(plan, result, client);
  } catch (const PdFailure& e) {  // (a UCX wait the client's leaving cut short fails as peer_closed)
    result.fallback = plan.client_gone ? "client_gone" : e.reason, result.detail = e.what();
  } catch (const WireError& e) {
    result.fallback = wire_reason(e), result.detail = e.what();
  } catch (const boost::system::system_error& e) {
    result.fallback = reason_of(e, plan.client_gone), result.detail = e.what();
  } catch (const std::exception& e) {  // e.g. the engine stopping under an import: still a local prefill
    result.fallback = "error", result.detail = e.what();
  }
  client.on_disconnect([] {});
  plan.active = nullptr;
  plan.ucx_active = nullptr;
  if (plan.client_gone && result.fallback.empty()) result.fallback = "client_gone";
  if (metrics_) {
    metrics_->bytes(static_cast<double>(result.bytes));
    if (result.fallback.empty()) metrics_->transfer(std::chrono::duration<double>(Clock::now() - start).count());
    else metrics_->fallback(result.fallback);
  }
  co_return result;
}

namespace {

// Best effort: tells P it may free the transfer's blocks now rather than at lease expiry.
// P's internal endpoints take the fleet's internal key (the replica's --internal-api-key, else --api-key).
void authorize(http::Request& req, const std::string& key) {
  if (!key.empty()) req.headers.set("Authorization", "Bearer " + key);
}

awaitable<void> send_release(const std::string& host, std::uint16_t port, std::uint64_t id, std::string key) {
  try {
    http::HttpClientConfig cc;
    cc.connect_timeout = std::chrono::milliseconds(500);
    cc.io_timeout = std::chrono::milliseconds(1000);
    http::HttpClient c(co_await boost::asio::this_coro::executor, cc);
    co_await c.connect(host, port);
    http::Request req;
    req.method = "POST";
    req.target = "/internal/prefill/release?transfer=" + std::to_string(id);
    authorize(req, key);
    co_await c.request(req);
  } catch (const std::exception&) {
  }
}

// The GET of one tcp pull: blocks [at, at + n) of transfer `id`.
awaitable<void> send_pull(http::HttpClient& c, std::uint64_t id, std::uint32_t at, std::uint32_t n, const std::string& key) {
  http::Request get;
  get.method = "GET";
  get.target = "/internal/prefill/blocks?transfer=" + std::to_string(id) + "&from=" + std::to_string(at) +
               "&count=" + std::to_string(n);
  authorize(get, key);
  co_await c.send(get);
}

// Adds an import's blocks to the result; false when the cache had no room for all that were asked.
bool count_imported(FetchResult& result, std::uint32_t done, std::uint32_t asked, std::size_t block_bytes) {
  result.imported_blocks += done;
  result.bytes += std::uint64_t{done} * block_bytes;
  return done == asked;
}

}  // namespace

// Pipelined: pull k+1 is read while the engine thread imports pull k (at most one import in flight). Two
// receive buffers in turn: pull k+2 reuses pull k's, whose import was awaited before pull k+1's began.
struct DecodeFetcher::Pulls {
  Pulls(std::uint64_t id_, std::uint32_t total_, http::HttpClient& tcp_) : id(id_), total(total_), tcp(tcp_) {}
  const std::uint64_t id;     // P's transfer id
  const std::uint32_t total;  // the wanted blocks, held ones included
  http::HttpClient& tcp;
  std::shared_ptr<UcxEndpoint> ucx;  // when the pulls go over ucx
  Landing landing;
  std::shared_ptr<http::AsyncQueue<std::uint32_t>> importing;
  std::uint32_t importing_n = 0;
  std::shared_ptr<ReceivedPull> buffers[2];
  std::size_t turn = 0;
};

awaitable<void> DecodeFetcher::transfer(Plan& plan, FetchResult& result, http::ResponseWriter&) {
  const auto ex = co_await boost::asio::this_coro::executor;
  http::HttpClientConfig hc;
  hc.connect_timeout = config_.connect_timeout;
  hc.io_timeout = config_.transfer_timeout;  // the answer waits for P's prefill
  http::HttpClient hello_client(ex, hc);
  const Accept accept = co_await handshake(plan, hello_client);
  http::HttpClientConfig pc;
  pc.connect_timeout = config_.connect_timeout;
  pc.io_timeout = config_.io_timeout;  // a P that stalls mid-stream is given up on after this
  pc.piece_size = 1 << 20;             // block frames are large: fewer, bigger reads
  http::HttpClient tcp(ex, pc);
  plan.active = &tcp;
  Pulls pulls(accept.transfer_id, static_cast<std::uint32_t>(plan.hashes.size()), tcp);
  // ucx: an endpoint to P's UCP listener (pooled); a failed connect downgrades to tcp (its own metric).
  const std::string ucx_host = accept.transport_host.empty() ? plan.host : accept.transport_host;
  if (accept.transport == "ucx" && ucx_) pulls.ucx = co_await connect_ucx(ucx_host, accept.transport_port);
  plan.ucx_active = pulls.ucx.get();
  if (!pulls.ucx) pulls.landing = co_await reserve_landing(pulls.total - plan.held);  // (ucx: small reads cost a UCX op each)
  std::exception_ptr failure;
  try {
    co_await pull_all(plan, pulls, result);
  } catch (...) {
    failure = std::current_exception();
  }
  plan.active = nullptr;
  plan.ucx_active = nullptr;
  if (pulls.ucx && !failure) ucx_->give_back(ucx_host, accept.transport_port, std::move(pulls.ucx));  // clean: the next pull's
  if (failure) {  // (no co_await inside a handler)
    co_await give_up(plan, pulls, result);
    std::rethrow_exception(failure);
  }
}

awaitable<Accept> DecodeFetcher::handshake(Plan& plan, http::HttpClient& c) {
  plan.active = &c;
  if (plan.client_gone) throw PdFailure("client_gone", "the client left before the transfer began");
  try {
    co_await c.connect(plan.host, plan.port);
  } catch (const boost::system::system_error& e) {
    throw PdFailure(plan.client_gone ? "client_gone" : "connect", e.what());
  }
  const Hello hello = make_hello(plan);
  http::Request req;
  req.method = "POST";
  req.target = "/internal/prefill";
  authorize(req, config_.peer_api_key);
  if (!plan.traceparent.empty()) req.headers.set("traceparent", plan.traceparent);
  req.headers.set("Content-Type", "application/octet-stream");
  req.body = encode(hello);
  const http::Response answer = co_await c.request(req);
  co_return accept_of(answer, hello, plan);
}

Hello DecodeFetcher::make_hello(const Plan& plan) const {
  Hello hello;
  hello.layout = layout_;
  hello.compat_hash = compat_hash(layout_);
  hello.tokens = plan.tokens;
  hello.held.assign(plan.hashes.begin(), plan.hashes.begin() + plan.held);
  hello.lease_ms = static_cast<std::uint32_t>(config_.lease.count());
  hello.cache_salt = plan.cache_salt;
  hello.transports = offered_transports();
  return hello;
}

// Throws PdFailure unless P accepted with D's layout, a transport D offered and exactly the blocks asked for.
Accept DecodeFetcher::accept_of(const http::Response& answer, const Hello& hello, const Plan& plan) const {
  if (answer.status != 200) {
    const std::string code = error_code_of(answer.body);
    const bool handshake = code == "compat_mismatch" || code == "protocol_version" || code == "no_common_transport";
    throw PdFailure(handshake ? "handshake" : "error", "P answered " + std::to_string(answer.status) + ": " + answer.body);
  }
  Frame f = decode_one(answer.body);
  auto* accept = std::get_if<Accept>(&f);
  if (!accept) throw PdFailure("malformed", "P's answer is not an accept frame");
  const std::vector<BlockHash> rest(plan.hashes.begin() + plan.held, plan.hashes.end());
  if (accept->layout != layout_ || accept->compat_hash != hello.compat_hash)
    throw PdFailure("handshake", "P's layout differs: " + describe_mismatch(layout_, accept->layout));
  if (pick_transport({accept->transport}, hello.transports).empty() || (accept->transport == "ucx" && accept->transport_port == 0))
    throw PdFailure("handshake", "P picked transport '" + accept->transport + "', which D did not offer");
  if (accept->first_block != plan.held || accept->hashes != rest)
    throw PdFailure("handshake", "P offers other blocks than asked for");
  return std::move(*accept);
}

awaitable<std::shared_ptr<UcxEndpoint>> DecodeFetcher::connect_ucx(const std::string& host, std::uint16_t port) {
  std::shared_ptr<UcxEndpoint> ucx;
  std::string why;
  try {
    ucx = co_await ucx_->acquire(host, port, Clock::now() + config_.connect_timeout);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!ucx) {
    if (metrics_) metrics_->transport_fallback("connect");
    std::fprintf(stderr, "kvfleet-replica: KV transfer pulls over tcp instead of ucx: %s\n", why.c_str());
  }
  co_return ucx;
}

// Blocks [held, total) in pulls of pull_blocks, each read and checked, then imported (or, landed, entered)
// on the engine thread while the next is read.
awaitable<void> DecodeFetcher::pull_all(Plan& plan, Pulls& p, FetchResult& result) {
  const auto ex = co_await boost::asio::this_coro::executor;
  if (plan.client_gone) throw PdFailure("client_gone", "the client left during the UCX connect");
  if (!p.ucx) co_await p.tcp.connect(plan.host, plan.port);
  const auto layers = static_cast<std::size_t>(layout_.num_layers);
  const std::span<char* const> landing_layers(p.landing.layers);
  for (std::uint32_t at = plan.held; at < p.total;) {
    const std::uint32_t n = std::min(config_.pull_blocks, p.total - at);
    std::shared_ptr<ReceivedPull>& buffer = p.buffers[p.turn++ % 2];
    if (p.ucx) {
      buffer = co_await pull_ucx(*p.ucx, p.id, at, n, plan, std::move(buffer));
    } else {
      co_await send_pull(p.tcp, p.id, at, n, config_.peer_api_key);
      if (!p.landing.blocks.empty()) {
        const auto landed = landing_layers.subspan(std::size_t{at - plan.held} * layers, std::size_t{n} * layers);
        co_await read_pull_into(p.tcp, layout_, plan.hashes, at, n, plan.deadline, landed);
      } else {
        buffer = co_await read_pull(p.tcp, layout_, plan.hashes, at, n, plan.deadline, std::move(buffer));
      }
    }
    if (metrics_) metrics_->pull(p.ucx ? "ucx" : "tcp");
    co_await finish_import(p, result);
    p.importing = p.landing.blocks.empty() ? start_import(ex, plan, buffer) : start_enter(ex, plan, p.landing, at, n);
    p.importing_n = n;
    at += n;
  }
  co_await finish_import(p, result);
}

// Awaits the import in flight, if any.
awaitable<void> DecodeFetcher::finish_import(Pulls& p, FetchResult& result) {
  if (!p.importing) co_return;
  const std::uint32_t done = co_await engine_result(std::exchange(p.importing, nullptr));
  if (!count_imported(result, done, p.importing_n, layout_.block_bytes()))
    throw PdFailure("cache_full", "no free KV block to import into");
}

// After a failed pull: the connections close (mid-pull, the stream's position is unknown), the import in
// flight still counts (its blocks were verified: they stay), and P is told to release the transfer.
awaitable<void> DecodeFetcher::give_up(const Plan& plan, Pulls& p, FetchResult& result) {
  p.tcp.close();
  if (p.ucx) p.ucx->close();
  try {
    if (p.importing) {
      const std::uint32_t done = co_await engine_result(std::exchange(p.importing, nullptr));
      count_imported(result, done, p.importing_n, layout_.block_bytes());  // verified: they stay
    }
  } catch (const std::exception&) {  // the engine is stopping; the pin's release still runs after the import
  }
  co_await send_release(plan.host, plan.port, p.id, config_.peer_api_key);  // the client leaving too: P may free at once
}

void DecodeFetcher::enable_ucx(std::shared_ptr<UcxWorker> worker) { ucx_ = std::make_unique<UcxPullClient>(std::move(worker)); }

std::vector<std::string> DecodeFetcher::offered_transports() const {
  std::vector<std::string> out;
  for (const auto& t : config_.transports)
    if (t != "ucx" || ucx_) out.push_back(t);
  if (out.empty()) out.push_back("tcp");  // P always serves the HTTP pull
  return out;
}

awaitable<std::shared_ptr<ReceivedPull>> DecodeFetcher::pull_ucx(UcxEndpoint& ep, std::uint64_t id, std::uint32_t at,
                                                                std::uint32_t n, const Plan& plan,
                                                                std::shared_ptr<ReceivedPull> reuse) {
  UcxPullRequest req;
  req.transfer = id, req.from = at, req.count = n, req.key = config_.peer_api_key;
  co_await send_pull_request(ep, req, Clock::now() + config_.io_timeout);
  std::shared_ptr<ReceivedPull> buffer = pull_buffer(layout_, n, std::move(reuse));
  UcxPullSource source(ep, config_.io_timeout, buffer);  // receives ahead into the buffer the reader checks
  co_return co_await read_pull_frames(source, layout_, plan.hashes, at, n, plan.deadline, std::move(buffer));
}

}  // namespace kvfleet::pd
