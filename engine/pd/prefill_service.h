// PrefillService: the prefill replica's (P's) side of KV transfer (Contract 3), served on P's HTTP port.
//
//   POST /internal/prefill            body: a hello frame. P checks the layout (409 on a mismatch, naming
//                                     the fields), computes the prompt's blocks with a prefill_only engine
//                                     request (its prefix cache reused), pins them under a lease and answers
//                                     an accept frame. D leaving during the prefill aborts it.
//   GET  /internal/prefill/blocks?transfer=ID&from=I&count=N
//                                     a chunked stream of block frames then an end frame (an error frame
//                                     instead when the lease ends mid-pull). Block bytes are copied on the
//                                     engine thread while pinned, so a block freed later is never read.
//                                     The pull that delivers the last block releases the transfer.
//   POST /internal/prefill/release?transfer=ID   D is done (or gives up): the blocks are freed.
//
// Lease: every pull and every written block frame extends it by the lease time; a reaper thread frees the
// blocks of transfers whose lease ran out (a D that died, stalled or never came back). A failed write
// (D gone) frees them at once. HTTP errors are OpenAI-style error objects (codes: compat_mismatch,
// unknown_transfer, lease_expired, bad_range, prefill_failed).
//
// Threading: handlers run on HTTP io threads; leases_ is guarded by mu_; the engine is reached through
// Engine::run_kv_task/submit/abort only.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/pd/engine_call.h"
#include "engine/pd/layout.h"
#include "engine/pd/pd_config.h"
#include "engine/pd/transport.h"
#include "kvfleet/http/server.h"

namespace kvfleet::pd {

class UcxPullServer;
class UcxWorker;

class PrefillService {
 public:
  PrefillService(Engine& engine, KvLayout layout, PdConfig config);
  ~PrefillService();  // stops the reaper and frees every lease
  PrefillService(const PrefillService&) = delete;
  PrefillService& operator=(const PrefillService&) = delete;

  boost::asio::awaitable<void> handle_prefill(const http::Request& req, http::ResponseWriter& w);
  boost::asio::awaitable<void> handle_pull(const http::Request& req, http::ResponseWriter& w);
  boost::asio::awaitable<void> handle_release(const http::Request& req, http::ResponseWriter& w);

  // The ucx transport (prefill_ucx.cpp): a UCP listener on host:port (0: a free port) whose pulls are
  // answered by serve_pull, needing `key` when it is not empty. Throws std::runtime_error when UCX cannot
  // listen; P then offers tcp alone. Call once, before serving.
  void enable_ucx(std::shared_ptr<UcxWorker> worker, const std::string& host, std::uint16_t port, std::string key);
  std::uint16_t ucx_port() const;  // 0 without ucx
  // One pull's answer on any transport: block frames [from, from + count) then an end frame, or one error
  // frame (lease_expired, bad_range) — the same bytes the HTTP pull's body carries.
  boost::asio::awaitable<void> serve_pull(std::uint64_t id, std::uint32_t from, std::uint32_t count, PullSink& sink);

  std::size_t num_leases() const;
  std::uint64_t leases_expired() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Lease {
    PinId pin = 0;
    std::uint32_t first = 0, count = 0;
    std::vector<BlockHash> hashes;  // of blocks first .. first + count - 1
    std::chrono::milliseconds ttl{0};
    Clock::time_point deadline;
  };
  // Extends the lease; false when it is gone (expired or released).
  bool touch(std::uint64_t id);
  // The transports P answers a hello with: ucx when its listener runs, and tcp (the HTTP pull) always.
  std::vector<std::string> offered_transports() const;
  std::string offered_list() const;
  // Writes the frames of blocks [first, last) of a checked lease into the sink (the pull's bytes are
  // produced here, once, for every transport); frees the lease when the sink fails or all is delivered.
  boost::asio::awaitable<void> serve_blocks(std::uint64_t id, const Lease& lease, std::uint32_t first, std::uint32_t last,
                                            PullSink& sink);
  // Drops the lease and unpins its blocks; false when it was gone already.
  bool release(std::uint64_t id);
  void reap();
  // Blocks [from, from + count) of the pin copied on the engine thread into the payloads of as many block
  // frames back to back (headers and checksums still to write); size 0 when the pin is gone.
  struct Batch {
    std::unique_ptr<char[]> bytes;
    std::size_t size = 0;
  };
  using Batches = http::AsyncQueue<Batch>;
  std::shared_ptr<Batches> start_read(boost::asio::any_io_executor ex, PinId pin, std::uint32_t from, std::uint32_t count);
  // Batch buffers (per_read_ frames each) are kept for the next pull: fresh memory costs a page fault
  // per 4 KiB, which the transfer profile showed. Shared with engine-thread tasks, so it outlives them.
  struct BufferPool {
    std::size_t bytes = 0;
    std::mutex mu;
    std::vector<std::unique_ptr<char[]>> spare;  // at most kSpare
    static constexpr std::size_t kSpare = 4;
    std::unique_ptr<char[]> take();
    void give_back(std::unique_ptr<char[]> buffer);
  };

  Engine& engine_;
  const KvLayout layout_;
  const std::uint64_t compat_;
  const PdConfig config_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::unordered_map<std::uint64_t, Lease> leases_;
  std::uint64_t next_id_ = 1;
  std::uint64_t expired_ = 0;
  std::thread reaper_;
  std::uint32_t per_read_ = 1;  // blocks per engine-thread read (about 8 MiB)
  std::shared_ptr<BufferPool> buffers_ = std::make_shared<BufferPool>();
  std::unique_ptr<UcxPullServer> ucx_;  // reset first in the destructor: its handlers call serve_pull
};

}  // namespace kvfleet::pd
