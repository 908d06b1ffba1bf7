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

struct DecodeFetcher::Plan {
  std::vector<TokenId> tokens;    // the wanted blocks' tokens
  std::vector<BlockHash> hashes;  // D's own hashes of them
  std::uint32_t held = 0;
  PinId pin = 0;
  std::string host;
  std::uint16_t port = 0;
  Clock::time_point deadline;
  http::HttpClient* active = nullptr;  // what the client's disconnect closes
  UcxEndpoint* ucx_active = nullptr;   // (the UCX endpoint of the pulls, when they go over ucx)
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
  hello.transports = offered_transports();
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
  if (accept->layout != layout_ || accept->compat_hash != hello.compat_hash)
    throw PdFailure("handshake", "P's layout differs: " + describe_mismatch(layout_, accept->layout));
  if (pick_transport({accept->transport}, hello.transports).empty() || (accept->transport == "ucx" && accept->transport_port == 0))
    throw PdFailure("handshake", "P picked transport '" + accept->transport + "', which D did not offer");
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
  // Pipelined: pull k+1 is read while the engine thread imports pull k (at most one import in flight).
  std::shared_ptr<http::AsyncQueue<std::uint32_t>> importing;
  std::uint32_t importing_n = 0;
  // Two receive buffers in turn: pull k+2 reuses pull k's, whose import was awaited before pull k+1's began.
  std::shared_ptr<ReceivedPull> buffers[2];
  std::size_t turn = 0;
  const auto imported = [&](std::uint32_t done, std::uint32_t asked) {
    result.imported_blocks += done;
    result.bytes += std::uint64_t{done} * layout_.block_bytes();
    return done == asked;
  };
  // ucx: an endpoint to P's UCP listener (pooled); a failed connect downgrades to tcp (its own metric).
  std::shared_ptr<UcxEndpoint> ucx;
  const std::string ucx_host = accept->transport_host.empty() ? plan.host : accept->transport_host;
  if (accept->transport == "ucx" && ucx_) {
    std::string why;
    try {
      ucx = co_await ucx_->acquire(ucx_host, accept->transport_port, Clock::now() + config_.connect_timeout);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!ucx) {
      if (metrics_) metrics_->transport_fallback("connect");
      std::fprintf(stderr, "kvfleet-replica: KV transfer pulls over tcp instead of ucx: %s\n", why.c_str());
    }
  }
  plan.ucx_active = ucx.get();
  Landing landing;
  if (!ucx) landing = co_await reserve_landing(total - plan.held);  // (ucx: small reads cost a UCX op each)
  const auto landed = [&](std::uint32_t at, std::uint32_t n) {
    const std::size_t layers = static_cast<std::size_t>(layout_.num_layers);
    return std::span<char* const>(landing.layers).subspan(std::size_t{at - plan.held} * layers, std::size_t{n} * layers);
  };
  std::exception_ptr failure;
  try {
    if (plan.client_gone) throw PdFailure("client_gone", "the client left during the UCX connect");
    if (!ucx) co_await pull.connect(plan.host, plan.port);
    for (std::uint32_t at = plan.held; at < total;) {
      const std::uint32_t n = std::min(config_.pull_blocks, total - at);
      std::shared_ptr<ReceivedPull>& buffer = buffers[turn++ % 2];
      if (ucx) {
        buffer = co_await pull_ucx(*ucx, id, at, n, plan, std::move(buffer));
      } else {
        http::Request get;
        get.method = "GET";
        get.target = "/internal/prefill/blocks?transfer=" + std::to_string(id) + "&from=" + std::to_string(at) +
                     "&count=" + std::to_string(n);
        authorize(get, config_.peer_api_key);
        co_await pull.send(get);
        if (!landing.blocks.empty()) {
          co_await read_pull_into(pull, layout_, plan.hashes, at, n, plan.deadline, landed(at, n));
        } else {
          buffer = co_await read_pull(pull, layout_, plan.hashes, at, n, plan.deadline, std::move(buffer));
        }
      }
      if (metrics_) metrics_->pull(ucx ? "ucx" : "tcp");
      if (importing) {
        const std::uint32_t done = co_await engine_result(std::exchange(importing, nullptr));
        if (!imported(done, importing_n)) throw PdFailure("cache_full", "no free KV block to import into");
      }
      importing = landing.blocks.empty() ? start_import(ex, plan, buffer) : start_enter(ex, plan, landing, at, n);
      importing_n = n;
      at += n;
    }
    if (importing) {
      const std::uint32_t done = co_await engine_result(std::exchange(importing, nullptr));
      if (!imported(done, importing_n)) throw PdFailure("cache_full", "no free KV block to import into");
    }
  } catch (...) {
    failure = std::current_exception();
  }
  plan.active = nullptr;
  plan.ucx_active = nullptr;
  if (ucx && !failure) ucx_->give_back(ucx_host, accept->transport_port, std::move(ucx));  // clean: the next pull's
  if (failure) {  // (no co_await inside a handler)
    pull.close();
    if (ucx) ucx->close();  // mid-pull: the stream's position is unknown
    try {
      if (importing) imported(co_await engine_result(std::exchange(importing, nullptr)), importing_n);  // verified: they stay
    } catch (const std::exception&) {  // the engine is stopping; the pin's release still runs after the import
    }
    co_await send_release(plan.host, plan.port, id, config_.peer_api_key);  // the client leaving too: P may free at once
    std::rethrow_exception(failure);
  }
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

awaitable<DecodeFetcher::Landing> DecodeFetcher::reserve_landing(std::uint32_t n) {
  struct Reserved {
    PinId pin = 0;
    std::vector<BlockId> blocks;
    std::vector<char*> layers;
  };
  // On the engine thread: n blocks off the free list into a pin of their own, with no prefix-cache entry,
  // so no step can read them while the pulls write them; all or nothing.
  auto reserve = [n](Scheduler& s, Backend& b) {
    Reserved r;
    KvCacheManager& kv = s.kv();
    r.pin = kv.pin({});
    const std::int64_t layers = b.kv_cache_shape().num_layers;
    bool host = true;
    for (std::uint32_t i = 0; host && i < n; ++i) {
      const BlockId block = kv.reserve_block(r.pin);
      if (block == kNoBlock) break;
      r.blocks.push_back(block);
      for (std::int64_t l = 0; host && l < layers; ++l) {
        const void* p = b.kv_host_bytes(l, block);  // the block is this pin's alone: D may write it
        host = p != nullptr;
        r.layers.push_back(static_cast<char*>(const_cast<void*>(p)));
      }
    }
    if (!host || r.blocks.size() < n) {
      kv.unpin(r.pin);  // back to the free list, uncached
      return Reserved{};
    }
    return r;
  };
  Reserved r = co_await on_engine_thread(engine_, std::move(reserve));
  Landing out;
  if (r.pin == 0) co_return out;
  out.pin = EnginePin(engine_, r.pin);
  out.blocks = std::move(r.blocks);
  out.layers = std::move(r.layers);
  co_return out;
}

std::shared_ptr<http::AsyncQueue<std::uint32_t>> DecodeFetcher::start_enter(boost::asio::any_io_executor ex, const Plan& plan,
                                                                             const Landing& landing, std::uint32_t at,
                                                                             std::uint32_t n) {
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const BlockHash root = layout_.root;
  const auto first = landing.blocks.begin() + (at - plan.held);
  // Between steps on the engine thread: each verified landing block becomes a prefix-cache entry (KV
  // events report it) held by the request's pin; one computed here meanwhile is kept instead. The landing
  // pin still holds its reference until the transfer ends, and frees whatever was not entered.
  auto task = [pin = plan.pin, blocks = std::vector<BlockId>(first, first + n), at, tokens = plan.tokens,
               hashes = plan.hashes, bs, root](Scheduler& s, Backend&) -> std::uint32_t {
    KvCacheManager& kv = s.kv();
    std::uint32_t done = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const std::size_t index = at + i;
      const auto toks = std::span<const TokenId>(tokens).subspan(index * bs, bs);
      const BlockHash parent = index == 0 ? root : hashes[index - 1];
      BlockId block = kv.cached_block(hashes[index], toks);
      if (block == kNoBlock) {
        if (!kv.enter_block(blocks[i], hashes[index], parent, toks)) break;
        block = blocks[i];
      }
      kv.add_to_pin(pin, block);
      ++done;
    }
    return done;
  };
  return start_on_engine_thread(engine_, std::move(ex), std::move(task));
}

std::shared_ptr<http::AsyncQueue<std::uint32_t>> DecodeFetcher::start_import(boost::asio::any_io_executor ex, const Plan& plan,
                                                                              std::shared_ptr<ReceivedPull> pull) {
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const BlockHash root = layout_.root;
  const std::size_t stride = block_frame_bytes(layout_.block_bytes());
  // Between steps on the engine thread: each block is entered in the prefix cache and its bytes written
  // from the receive buffer in the same task, so no step sees a half-written block. Runs of consecutive
  // new blocks go to the backend in one call (the CUDA backend stages each run through pinned memory).
  auto task = [pin = plan.pin, pull = std::move(pull), tokens = plan.tokens, hashes = plan.hashes, bs, root,
               stride](Scheduler& s, Backend& b) -> std::uint32_t {
    KvCacheManager& kv = s.kv();
    std::vector<BlockId> run;
    const char* run_start = nullptr;
    const auto flush = [&] {
      if (!run.empty()) b.write_kv_blocks(run, run_start, stride);
      run.clear();
    };
    std::uint32_t done = 0;
    for (const BlockView& f : pull->blocks) {
      const auto toks = std::span<const TokenId>(tokens).subspan(std::size_t{f.index} * bs, bs);
      const BlockHash parent = f.index == 0 ? root : hashes[f.index - 1];
      BlockId block = kv.cached_block(f.hash, toks);
      if (block != kNoBlock) {  // computed here meanwhile: keep ours
        flush();
        kv.add_to_pin(pin, block);
      } else {
        block = kv.import_block(pin, f.hash, parent, toks);
        if (block == kNoBlock) break;
        if (run.empty()) run_start = f.payload.data();
        run.push_back(block);
      }
      ++done;
    }
    flush();
    return done;
  };
  return start_on_engine_thread(engine_, std::move(ex), std::move(task));
}
}  // namespace kvfleet::pd
