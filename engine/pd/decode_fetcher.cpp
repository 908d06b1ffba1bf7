#include "engine/pd/decode_fetcher.h"

#include <boost/beast/core/error.hpp>
#include <boost/json.hpp>
#include <boost/system/system_error.hpp>
#include <chrono>

#include "kvfleet/http/client.h"

namespace kvfleet::pd {
using boost::asio::awaitable;
using Clock = std::chrono::steady_clock;

namespace {

// Why a transfer stopped; caught in fetch() and turned into FetchResult::fallback.
struct PdFailure : std::runtime_error {
  PdFailure(std::string reason_, const std::string& detail) : std::runtime_error(detail), reason(std::move(reason_)) {}
  std::string reason;
};

std::string reason_of(const boost::system::system_error& e, bool client_gone) {
  if (client_gone) return "client_gone";
  const auto ec = e.code();
  if (ec == boost::beast::error::timeout || ec == boost::asio::error::timed_out) return "timeout";
  return "peer_closed";
}

// The error object's code of a non-200 answer from P.
std::string error_code_of(const std::string& body) {
  boost::system::error_code ec;
  const auto v = boost::json::parse(body, ec);
  if (ec || !v.is_object()) return {};
  const auto* err = v.as_object().if_contains("error");
  if (!err || !err->is_object()) return {};
  const auto* code = err->as_object().if_contains("code");
  return code && code->is_string() ? std::string(code->as_string()) : std::string();
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

struct DecodeFetcher::Plan {
  std::vector<TokenId> tokens;    // the wanted blocks' tokens
  std::vector<BlockHash> hashes;  // D's own hashes of them
  std::uint32_t held = 0;
  PinId pin = 0;
  std::string host;
  std::uint16_t port = 0;
  Clock::time_point deadline;
  http::HttpClient* active = nullptr;  // what the client's disconnect closes
  bool client_gone = false;
};

awaitable<FetchResult> DecodeFetcher::fetch(std::span<const TokenId> prompt, std::string prefill_url,
                                            http::ResponseWriter& client) {
  FetchResult result;
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const std::size_t wanted = prompt.empty() ? 0 : (prompt.size() - 1) / bs;
  result.wanted_blocks = static_cast<std::uint32_t>(wanted);
  if (wanted == 0) co_return result;  // shorter than a block + 1 token: nothing to ship
  Plan plan;
  plan.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(wanted * bs));
  plan.hashes = block_hashes(layout_.root, plan.tokens, bs);
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
    });
    co_await transfer(plan, result, client);
  } catch (const PdFailure& e) {
    result.fallback = e.reason, result.detail = e.what();
  } catch (const WireError& e) {
    result.fallback = wire_reason(e), result.detail = e.what();
  } catch (const boost::system::system_error& e) {
    result.fallback = reason_of(e, plan.client_gone), result.detail = e.what();
  }
  client.on_disconnect([] {});
  plan.active = nullptr;
  if (plan.client_gone && result.fallback.empty()) result.fallback = "client_gone";
  if (metrics_) {
    metrics_->bytes(static_cast<double>(result.bytes));
    if (result.fallback.empty()) metrics_->transfer(std::chrono::duration<double>(Clock::now() - start).count());
    else metrics_->fallback(result.fallback);
  }
  co_return result;
}

namespace {

// Reads one pull's frames: block frames for exactly [from, from + count), then an end frame.
awaitable<std::vector<BlockFrame>> read_pull(http::HttpClient& c, const KvLayout& layout, const std::vector<BlockHash>& hashes,
                                             std::uint32_t from, std::uint32_t count, Clock::time_point deadline) {
  const http::ResponseHead head = co_await c.read_head();
  if (head.status != 200) {
    const std::string body = co_await c.read_body();
    const std::string code = error_code_of(body);
    throw PdFailure(code == "lease_expired" ? "lease_expired" : "error", "pull answered " + std::to_string(head.status) + ": " + body);
  }
  FrameDecoder decoder(layout.block_bytes() + 4096);
  std::vector<BlockFrame> got;
  bool ended = false;
  while (!ended) {
    auto piece = co_await c.read_some();
    if (!piece) break;
    if (Clock::now() > deadline) throw PdFailure("timeout", "the transfer took longer than its deadline");
    decoder.feed(*piece);
    while (auto f = decoder.next()) {
      if (auto* e = std::get_if<ErrorFrame>(&*f))
        throw PdFailure(e->code == ErrorCode::lease_expired ? "lease_expired" : "error", "P: " + e->message);
      if (auto* end = std::get_if<End>(&*f)) {
        if (end->num_blocks != got.size() || got.size() != count) throw PdFailure("malformed", "end frame after too few blocks");
        ended = true;
        break;
      }
      auto* b = std::get_if<BlockFrame>(&*f);
      if (!b) throw PdFailure("malformed", "unexpected frame in a pull");
      const std::uint32_t want = from + static_cast<std::uint32_t>(got.size());
      if (b->index != want || got.size() >= count) throw PdFailure("malformed", "block " + std::to_string(b->index) + " out of order");
      if (b->hash != hashes[want]) throw PdFailure("malformed", "block " + std::to_string(want) + " carries another hash");
      if (b->layer_begin != 0 || b->layer_end != layout.num_layers || b->payload.size() != layout.block_bytes())
        throw PdFailure("malformed", "block " + std::to_string(want) + " has the wrong layer range or size");
      got.push_back(std::move(*b));
    }
  }
  if (!ended) throw PdFailure("peer_closed", decoder.partial() ? "the stream ended inside a frame" : "the stream ended early");
  // Read the body to its end (the last chunk), so the connection is ready for the next pull.
  while (auto rest = co_await c.read_some())
    if (!rest->empty()) throw PdFailure("malformed", "bytes after the end frame");
  co_return got;
}

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

}  // namespace

awaitable<void> DecodeFetcher::transfer(Plan& plan, FetchResult& result, http::ResponseWriter&) {
  const auto ex = co_await boost::asio::this_coro::executor;
  http::HttpClientConfig hc;
  hc.connect_timeout = config_.connect_timeout;
  hc.io_timeout = config_.transfer_timeout;  // the answer waits for P's prefill
  http::HttpClient hello_client(ex, hc);
  plan.active = &hello_client;
  if (plan.client_gone) throw PdFailure("client_gone", "the client left before the transfer began");
  try {
    co_await hello_client.connect(plan.host, plan.port);
  } catch (const boost::system::system_error& e) {
    throw PdFailure(plan.client_gone ? "client_gone" : "connect", e.what());
  }
  Hello hello;
  hello.layout = layout_;
  hello.compat_hash = compat_hash(layout_);
  hello.tokens = plan.tokens;
  hello.held.assign(plan.hashes.begin(), plan.hashes.begin() + plan.held);
  hello.lease_ms = static_cast<std::uint32_t>(config_.lease.count());
  http::Request req;
  req.method = "POST";
  req.target = "/internal/prefill";
  authorize(req, config_.peer_api_key);
  req.headers.set("Content-Type", "application/octet-stream");
  req.body = encode(hello);
  const http::Response answer = co_await hello_client.request(req);
  if (answer.status != 200) {
    const std::string code = error_code_of(answer.body);
    const bool handshake = code == "compat_mismatch" || code == "protocol_version" || code == "no_common_transport";
    throw PdFailure(handshake ? "handshake" : "error", "P answered " + std::to_string(answer.status) + ": " + answer.body);
  }
  Frame f = decode_one(answer.body);
  auto* accept = std::get_if<Accept>(&f);
  if (!accept) throw PdFailure("malformed", "P's answer is not an accept frame");
  const std::vector<BlockHash> rest(plan.hashes.begin() + plan.held, plan.hashes.end());
  if (accept->layout != layout_ || accept->compat_hash != hello.compat_hash || accept->transport != "tcp")
    throw PdFailure("handshake", "P's layout differs: " + describe_mismatch(layout_, accept->layout));
  if (accept->first_block != plan.held || accept->hashes != rest)
    throw PdFailure("handshake", "P offers other blocks than asked for");
  const std::uint64_t id = accept->transfer_id;
  const auto total = static_cast<std::uint32_t>(plan.hashes.size());
  http::HttpClientConfig pc;
  pc.connect_timeout = config_.connect_timeout;
  pc.io_timeout = config_.io_timeout;  // a P that stalls mid-stream is given up on after this
  pc.piece_size = 1 << 20;             // block frames are large: fewer, bigger reads
  http::HttpClient pull(ex, pc);
  plan.active = &pull;
  std::exception_ptr failure;
  try {
    co_await pull.connect(plan.host, plan.port);
    for (std::uint32_t at = plan.held; at < total;) {
      const std::uint32_t n = std::min(config_.pull_blocks, total - at);
      http::Request get;
      get.method = "GET";
      get.target = "/internal/prefill/blocks?transfer=" + std::to_string(id) + "&from=" + std::to_string(at) +
                   "&count=" + std::to_string(n);
      authorize(get, config_.peer_api_key);
      co_await pull.send(get);
      std::vector<BlockFrame> frames = co_await read_pull(pull, layout_, plan.hashes, at, n, plan.deadline);
      const std::uint32_t imported = co_await import_blocks(plan.pin, plan, std::move(frames));
      result.imported_blocks += imported;
      result.bytes += std::uint64_t{imported} * layout_.block_bytes();
      if (imported < n) throw PdFailure("cache_full", "no free KV block to import into");
      at += n;
    }
  } catch (...) {
    failure = std::current_exception();
  }
  plan.active = nullptr;
  if (failure) {  // (no co_await inside a handler)
    pull.close();
    co_await send_release(plan.host, plan.port, id, config_.peer_api_key);  // the client leaving too: P may free at once
    std::rethrow_exception(failure);
  }
}

awaitable<std::uint32_t> DecodeFetcher::import_blocks(PinId pin, const Plan& plan, std::vector<BlockFrame> frames) {
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const BlockHash root = layout_.root;
  auto task = [pin, frames = std::move(frames), tokens = plan.tokens, hashes = plan.hashes, bs, root](Scheduler& s, Backend& b) -> std::uint32_t {
        KvCacheManager& kv = s.kv();
        std::uint32_t done = 0;
        for (const BlockFrame& f : frames) {
          const auto toks = std::span<const TokenId>(tokens).subspan(std::size_t{f.index} * bs, bs);
          const BlockHash parent = f.index == 0 ? root : hashes[f.index - 1];
          BlockId block = kv.cached_block(f.hash, toks);
          if (block != kNoBlock) {  // computed here meanwhile: keep ours
            kv.add_to_pin(pin, block);
          } else {
            block = kv.import_block(pin, f.hash, parent, toks);
            if (block == kNoBlock) break;
            b.write_kv_blocks(std::span<const BlockId>(&block, 1), f.payload.data());  // layers in order
          }
          ++done;
        }
        return done;
      };
  const std::uint32_t done = co_await on_engine_thread(engine_, std::move(task));
  co_return done;
}

}  // namespace kvfleet::pd
