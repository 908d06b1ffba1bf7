// The `ucx` KV transport (Contract 3): the same pulls as GET /internal/prefill/blocks, carried on a UCP
// stream endpoint instead of HTTP. The hello and accept still go over HTTP (POST /internal/prefill);
// P's accept names the transport it picked and, for ucx, the port of its UCP listener (the host is the
// one D reached P's HTTP port at, unless the accept names one).
//
// Why the stream API: a pull's answer is already a self-delimiting byte stream of checksummed frames
// (what the HTTP body carries), so a byte stream carries it unchanged, D receives it straight into its
// pull buffer (no intermediate copy, as with tag messages of unknown size), and P's and D's frame code
// is the same for both transports. UCX picks the lanes (UCX_TLS); with these sockaddr (client/server)
// endpoints UCX 1.13 chooses tcp even on one machine (measured, engine/pd/README.md), RDMA where a device is.
//
// On the stream, per connection (integers little-endian):
//   D -> P  "KVFUCX1\n"                       then P -> D "KVFREADY": a small exchange, so the endpoint
//                                             is wired up before a large send (UCX 1.13 aborts on a
//                                             64 MiB stream send posted before its wire-up completes)
//   D -> P  "KVFP" | u32 key bytes | u64 transfer | u32 from | u32 count | key    a pull request
//   D -> P  "KVFI" | 20 zero bytes    then P -> D "KVFPONG\n": D checks a pooled endpoint before a transfer
//   P -> D  pieces: u64 n | n bytes ... | u64 0                                   the pull's frames
// One pull at a time per endpoint; D pools idle endpoints per P. Every D-side wait has a deadline
// (connect: pd_connect_timeout_ms, each read: pd_io_timeout_ms, the whole transfer:
// pd_transfer_timeout_ms), so a P that dies or stalls ends in D's fallback as on TCP.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/pd/transport.h"
#include "engine/pd/ucx/worker.h"

namespace kvfleet::pd {

using UcxClock = std::chrono::steady_clock;

struct UcxPullRequest {
  std::uint64_t transfer = 0;
  std::uint32_t from = 0, count = 0;
  std::string key;  // D's internal key ("" when none)
};

inline constexpr std::size_t kUcxMaxKeyBytes = 4096;
inline constexpr std::uint64_t kUcxMaxPiece = 256u << 20;

// P: writes a pull's answer as pieces on the endpoint. Each write returns after UCX is done with the
// piece's bytes; false (never a throw) once the endpoint failed, D is gone or io_timeout passed.
class UcxPullSink : public PullSink {
 public:
  UcxPullSink(UcxEndpoint& ep, std::chrono::milliseconds io_timeout) : ep_(ep), io_timeout_(io_timeout) {}
  boost::asio::awaitable<bool> write(std::string_view piece) override;
  // The piece's length and its parts (a frame's header, its layers straight from P's cache, its trailer)
  // go out as one UCP iov send: no joining copy.
  boost::asio::awaitable<bool> write_pieces(std::span<const std::string_view> pieces) override;
  boost::asio::awaitable<bool> finish() override;

 private:
  UcxEndpoint& ep_;
  std::chrono::milliseconds io_timeout_;
};

struct ReceivedPull;

// D: reads one pull's answer from the endpoint; 0 after the closing piece. Each wait has io_timeout;
// throws PdFailure (timeout, peer_closed, malformed).
// With `target` (the buffer read_pull_frames will fill, pull_buffer(), passed to it as `reuse`) and a
// first read into its start, the whole answer is received ahead of the reader into that buffer
// (UcxEndpoint::receive_pieces: each piece's receive posted by the worker thread the moment the one before
// completed, so UCX copies each byte once, from its receive segment into place) and each read returns what
// is already in place, with no copy. Otherwise (no target, or reads elsewhere: the fault proxy) each read
// receives straight into the caller's span, piece by piece. A source that goes away mid-answer closes the
// endpoint (the stream's position is unknown); the target stays alive until UCX is done with it.
class UcxPullSource : public ByteSource {
 public:
  UcxPullSource(UcxEndpoint& ep, std::chrono::milliseconds io_timeout, std::shared_ptr<ReceivedPull> target = nullptr);
  ~UcxPullSource() override;
  UcxPullSource(const UcxPullSource&) = delete;
  UcxPullSource& operator=(const UcxPullSource&) = delete;
  boost::asio::awaitable<std::size_t> read_some_into(std::span<char> into) override;

 private:
  boost::asio::awaitable<std::size_t> read_ahead(std::span<char> into);

  UcxEndpoint& ep_;
  std::chrono::milliseconds io_timeout_;
  std::uint64_t left_ = 0;  // bytes of the current piece not read yet
  bool ended_ = false;
  std::shared_ptr<ReceivedPull> target_;
  std::shared_ptr<PieceReceive> ahead_;  // the receive ahead into target_, once started
  const char* base_ = nullptr;           // target_'s memory
  std::size_t delivered_ = 0;            // bytes of it handed to the reader
  PieceProgress progress_;
};

// D: sends a pull request on the endpoint.
boost::asio::awaitable<void> send_pull_request(UcxEndpoint& ep, const UcxPullRequest& req, UcxClock::time_point deadline);

// P: a UCP listener whose connections are served by `handler`, one pull at a time per connection, on
// a thread of its own (an Asio loop; the handler reaches the engine through run_kv_task as HTTP does).
class UcxPullServer {
 public:
  using Handler = std::function<boost::asio::awaitable<void>(const UcxPullRequest&, PullSink&)>;
  // Throws std::runtime_error when it cannot listen on host:port (0: a free port).
  UcxPullServer(std::shared_ptr<UcxWorker> worker, const std::string& host, std::uint16_t port,
                std::chrono::milliseconds io_timeout, Handler handler);
  ~UcxPullServer();  // closes every connection, waits (bounded) for their handlers, stops the thread
  UcxPullServer(const UcxPullServer&) = delete;
  UcxPullServer& operator=(const UcxPullServer&) = delete;
  std::uint16_t port() const { return port_; }

 private:
  boost::asio::awaitable<void> serve(std::shared_ptr<UcxEndpoint> ep);

  std::shared_ptr<UcxWorker> worker_;
  std::chrono::milliseconds io_timeout_;
  Handler handler_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{io_.get_executor()};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::weak_ptr<UcxEndpoint>> conns_;  // guarded by mu_
  std::atomic<int> active_{0};
  std::atomic<bool> stopping_{false};
  std::uint16_t port_ = 0;
};

// D: endpoints to prefill replicas, pooled per host:port (a pull borrows one; a clean one comes back).
// Thread-safe.
class UcxPullClient {
 public:
  explicit UcxPullClient(std::shared_ptr<UcxWorker> worker) : worker_(std::move(worker)) {}
  // An endpoint that finished the READY exchange: an idle pooled one that still answers a ping (one round
  // trip; a dead one is closed and the next tried), else a new connection. Throws PdFailure("connect")
  // when it cannot connect before the deadline (refused, unreachable, silent).
  boost::asio::awaitable<std::shared_ptr<UcxEndpoint>> acquire(const std::string& host, std::uint16_t port,
                                                               UcxClock::time_point deadline);
  // Pooled endpoints found dead by acquire's ping (and replaced) so far.
  std::uint64_t replaced() const { return replaced_; }
  // After a pull that ended cleanly: the endpoint may serve the next one.
  void give_back(const std::string& host, std::uint16_t port, std::shared_ptr<UcxEndpoint> ep);

 private:
  static constexpr std::size_t kIdlePerPeer = 4;
  static boost::asio::awaitable<bool> alive(UcxEndpoint& ep, UcxClock::time_point deadline);
  std::shared_ptr<UcxWorker> worker_;
  std::atomic<std::uint64_t> replaced_{0};
  std::mutex mu_;
  std::map<std::string, std::vector<std::shared_ptr<UcxEndpoint>>> idle_;  // guarded by mu_
};

}  // namespace kvfleet::pd
