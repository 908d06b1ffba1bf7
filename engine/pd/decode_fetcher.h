// DecodeFetcher: the decode replica's (D's) side of KV transfer (Contract 3). Before a request that names
// a prefill replica (x-kvfleet-prefill-from) is submitted, fetch():
//   1. pins the leading full blocks D already holds (at most (prompt - 1) / block_size blocks: the last
//      prompt token is always D's own forward, so sampling and seeds behave exactly as in mixed mode);
//   2. sends P a hello (layout, compat hash, the tokens of the wanted blocks, the held blocks' hashes),
//      checks P's accept (layout, range, block hashes), then pulls the blocks in batches of pull_blocks;
//   3. checks every frame (checksum, index, hash against D's own Contract 1 hash of the tokens, layer
//      range, size) and imports each batch on the engine thread as prefix-cache entries (KV events
//      report them) held by the same pin.
// The caller submits the request while the returned pin is alive: its prefix-cache hit then covers the
// imported blocks, and it releases the pin when the request is done. Any failure stops the transfer; the
// blocks verified so far stay, the rest is prefilled locally, the reason is counted
// (kvfleet_pd_fallbacks_total) and P is told to release the transfer (best effort; its lease covers the
// rest). The client leaving closes the connection to P at once.
// Threading: fetch() runs in a handler coroutine on the connection's strand.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <span>
#include <string>

#include "engine/pd/engine_call.h"
#include "engine/pd/layout.h"
#include "engine/pd/pd_config.h"
#include "engine/pd/pd_metrics.h"
#include "engine/pd/pull_reader.h"
#include "engine/pd/ucx/transport.h"
#include "engine/pd/wire.h"
#include "kvfleet/http/server.h"

namespace kvfleet::pd {

struct FetchResult {
  EnginePin pin;  // D's held and imported blocks; keep it until the request is done
  std::uint32_t wanted_blocks = 0, held_blocks = 0, imported_blocks = 0;
  std::uint64_t bytes = 0;
  std::string fallback;  // empty when every wanted block is here; else the reason (see pd_metrics.h)
  std::string detail;
};

// "http://host:port" (a trailing slash allowed) or "host:port". False on anything else.
bool parse_peer_url(std::string_view url, std::string& host, std::uint16_t& port);

class DecodeFetcher {
 public:
  DecodeFetcher(Engine& engine, KvLayout layout, PdConfig config, PdMetrics* metrics)
      : engine_(engine), layout_(std::move(layout)), config_(config), metrics_(metrics) {}

  // `traceparent` (W3C, may be empty) goes to P with the handshake, so that P's span joins the request's trace.
  boost::asio::awaitable<FetchResult> fetch(std::span<const TokenId> prompt, std::string prefill_url,
                                            http::ResponseWriter& client, std::string cache_salt = {},
                                            std::string traceparent = {});
  // The ucx transport: pulls go over UCP endpoints of `worker`, pooled per P, when config.transports
  // lists ucx and P picks it; a failed UCX connect pulls over tcp instead. Call once, before fetching.
  void enable_ucx(std::shared_ptr<UcxWorker> worker);

 private:
  // One fetch's transfer: what D asks P for, and what the client's disconnect closes.
  struct Plan {
    std::vector<TokenId> tokens;    // the wanted blocks' tokens
    std::vector<BlockHash> hashes;  // D's own hashes of them
    BlockHash root = 0;             // their chain's root: the model's, or the request's salted one (Contract 1)
    std::string cache_salt;
    std::string traceparent;
    std::uint32_t held = 0;
    PinId pin = 0;
    std::string host;
    std::uint16_t port = 0;
    std::chrono::steady_clock::time_point deadline;
    http::HttpClient* active = nullptr;  // what the client's disconnect closes
    UcxEndpoint* ucx_active = nullptr;   // (the UCX endpoint of the pulls, when they go over ucx)
    bool client_gone = false;
  };
  struct Pulls;  // an accepted transfer's pulls in progress (decode_fetcher.cpp)

  // The handshake, then the pulls and their imports; on a failure, P is told to release the transfer.
  boost::asio::awaitable<void> transfer(Plan& plan, FetchResult& result, http::ResponseWriter& client);
  // Sends P the hello over `c` (kept open by the caller) and returns P's accept, checked.
  boost::asio::awaitable<Accept> handshake(Plan& plan, http::HttpClient& c);
  Hello make_hello(const Plan& plan) const;
  Accept accept_of(const http::Response& answer, const Hello& hello, const Plan& plan) const;
  // A pooled endpoint to P's UCP listener; null (counted, logged) when it does not connect.
  boost::asio::awaitable<std::shared_ptr<UcxEndpoint>> connect_ucx(const std::string& host, std::uint16_t port);
  boost::asio::awaitable<void> pull_all(Plan& plan, Pulls& pulls, FetchResult& result);
  boost::asio::awaitable<void> finish_import(Pulls& pulls, FetchResult& result);
  boost::asio::awaitable<void> give_up(const Plan& plan, Pulls& pulls, FetchResult& result);

  // Queues the import of a verified pull on the engine thread; the queue gets how many blocks are in.
  std::shared_ptr<http::AsyncQueue<std::uint32_t>> start_import(boost::asio::any_io_executor ex, const Plan& plan,
                                                                std::shared_ptr<ReceivedPull> pull);

  // Landing blocks for every block still wanted (CPU backend: a tcp pull reads the payloads straight into
  // them, no receive buffer and no import copy); empty when the cache is not host memory or too few
  // blocks are free (then pulls go through receive buffers and start_import).
  struct Landing {
    EnginePin pin;                // the reserved blocks not entered yet (freed uncached when released)
    std::vector<BlockId> blocks;  // for blocks held .. total - 1
    std::vector<char*> layers;    // their layers' memory, blocks.size() * num_layers
  };
  boost::asio::awaitable<Landing> reserve_landing(std::uint32_t n);
  // Enters a landed pull's verified blocks [at, at + n) in the prefix cache under the request's pin.
  std::shared_ptr<http::AsyncQueue<std::uint32_t>> start_enter(boost::asio::any_io_executor ex, const Plan& plan,
                                                               const Landing& landing, std::uint32_t at, std::uint32_t n);

  // One pull over UCX: the request, then the same frame reading and checking as the HTTP pull's.
  boost::asio::awaitable<std::shared_ptr<ReceivedPull>> pull_ucx(UcxEndpoint& ep, std::uint64_t id, std::uint32_t at,
                                                                 std::uint32_t n, const Plan& plan,
                                                                 std::shared_ptr<ReceivedPull> reuse);
  // What the hello offers: config.transports less ucx when it is not enabled.
  std::vector<std::string> offered_transports() const;

  Engine& engine_;
  const KvLayout layout_;
  const PdConfig config_;
  PdMetrics* metrics_;
  std::unique_ptr<UcxPullClient> ucx_;
};

}  // namespace kvfleet::pd
