// PrefillService: the prefill replica's (P's) side of KV transfer (Contract 3), served on P's HTTP port.
//
//   POST /internal/prefill            body: a hello frame. P checks the layout (409 on a mismatch, naming
//                                     the fields), starts a prefill_only engine request over the wanted
//                                     blocks (its prefix cache reused) and answers an accept frame as soon
//                                     as the first wanted block is computed (or the prefill ended): D pulls
//                                     while the rest of the prompt is still being computed. D leaving
//                                     before the accept aborts the prefill; after it, the lease does.
//   GET  /internal/prefill/blocks?transfer=ID&from=I&count=N
//                                     a chunked stream of block frames then an end frame (an error frame
//                                     instead when the lease ends or the prefill fails mid-pull). A block
//                                     not computed yet is waited for (each engine step may complete more);
//                                     each is sent once pinned, on a CPU replica straight from the cache
//                                     memory (prefill_send.cpp). The pull that delivers the last block
//                                     releases the transfer.
//   POST /internal/prefill/release?transfer=ID   D is done (or gives up): the blocks are freed.
//
// Lease: every pull, every written block frame and every wait for a block extends it by the lease time;
// a reaper thread frees the blocks of transfers whose lease ran out (a D that died, stalled or never came
// back) and aborts their prefill if it still runs. A failed write (D gone) frees them at once. HTTP errors
// are OpenAI-style error objects (codes: compat_mismatch, unknown_transfer, lease_expired, bad_range,
// prefill_failed).
//
// Threading: handlers run on HTTP io threads; leases_ is guarded by mu_; the engine is reached through
// Engine::run_kv_task/submit/abort only.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/pd/engine_call.h"
#include "engine/pd/layout.h"
#include "engine/pd/pd_config.h"
#include "engine/pd/transport.h"
#include "engine/pd/wire.h"
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

  // The ucx transport (ucx/prefill.cpp): a UCP listener on host:port (0: a free port) whose pulls are
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
    // The blocks sent so far and the ones ready to send, pinned in order from block `first` (the stream
    // pin), shared with the pulls sending from them: a lease that ends (expiry, release) while a pull
    // writes straight from the cache memory leaves the blocks pinned until that write is done.
    std::shared_ptr<EnginePin> hold;
    PinId pin = 0;  // hold's
    std::uint32_t first = 0, count = 0;
    std::vector<BlockHash> hashes;  // of blocks first .. first + count - 1
    std::chrono::milliseconds ttl{0};
    Clock::time_point deadline;
    std::shared_ptr<const std::vector<TokenId>> tokens;  // the wanted blocks' (to find those computed so far)
    RequestId prefill = 0;        // the prefill while it runs (aborted when the lease ends first)
    PinId done = 0;               // once it finished: its pin of every block (held by `done_hold`)
    std::shared_ptr<EnginePin> done_hold;
    bool failed = false;          // it ended without its blocks
  };
  // POST /internal/prefill's steps (prefill_hello.cpp). The refusal of a hello P cannot serve, if any.
  std::optional<http::Response> check_hello(const Hello& hello, const std::vector<BlockHash>& hashes) const;
  // A new stream pin with wanted blocks [first, end) when P's prefix cache holds all of them (true), else
  // an empty one (false): the prefill computes them and locate pins them as they come.
  boost::asio::awaitable<std::pair<PinId, bool>> pin_cached(const std::vector<TokenId>& tokens,
                                                            const std::vector<BlockHash>& hashes, std::size_t first);
  // Starts the prefill_only request over the wanted blocks, its outputs into `queue`; 0 with `refused`
  // set when the engine refuses it.
  using Outputs = http::AsyncQueue<RequestOutput>;
  RequestId submit_prefill(std::vector<TokenId> tokens, std::string cache_salt, std::shared_ptr<Outputs> queue,
                           std::string& refused);
  Accept make_accept(const Hello& hello, const std::vector<BlockHash>& hashes, std::size_t first) const;
  // Opens the transfer's lease on the stream pin `hold` (and the prefill while it runs); returns its id.
  std::uint64_t open_lease(const Accept& a, std::shared_ptr<EnginePin> hold, std::vector<TokenId> tokens,
                           RequestId prefill);
  // Answers the accept when the first wanted block is ready, then follows the prefill to its end.
  boost::asio::awaitable<void> send_accept(const Accept& a, RequestId prefill, Outputs& outputs, http::ResponseWriter& w);
  // Extends the lease; false when it is gone (expired or released).
  bool touch(std::uint64_t id);
  // The transports P answers a hello with: ucx when its listener runs, and tcp (the HTTP pull) always.
  std::vector<std::string> offered_transports() const;
  std::string offered_list() const;
  // Writes the frames of blocks [first, last) of a checked lease into the sink (the pull's bytes are
  // produced here, once, for every transport), each block once computed; frees the lease when the sink
  // fails or all is delivered.
  boost::asio::awaitable<void> serve_blocks(std::uint64_t id, const Lease& lease, std::uint32_t first, std::uint32_t last,
                                            PullSink& sink);
  // Drops the lease, unpins its blocks and aborts its prefill if it still runs; false when it was gone.
  bool release(std::uint64_t id);
  void reap();
  // The prefill of a lease ended: its pin now holds every block (or it failed).
  void prefill_done(std::uint64_t id, const RequestOutput& out);

  // Blocks ready to send from `at` on, up to `last`: the stream pin grows, on the engine thread, by the
  // blocks the prefill has computed so far (found in P's prefix cache, or in its pin once it finished).
  struct Ready {
    enum class State { ready, waiting, gone, failed } state = State::waiting;
    std::vector<BlockId> blocks;      // blocks at .. at + blocks.size() - 1
    std::vector<const char*> layers;  // their layers in host memory, block-major; empty: not host memory
  };
  Ready locate(const Lease& lease, std::uint32_t at, std::uint32_t last, Scheduler& s, Backend& b) const;
  // Waits (polling between engine steps) until at least one block from `at` on is ready, the lease is gone
  // or the prefill failed; the lease is extended meanwhile (D is waiting for these blocks).
  // `stop`, when given, ends the wait early (state waiting) once it returns true.
  boost::asio::awaitable<Ready> wait_ready(std::uint64_t id, std::uint32_t at, std::uint32_t last,
                                           std::function<bool()> stop);

  // Sends block frames [at, at + ready.blocks.size()) of a pull; false when D is gone or the lease ended.
  // Host memory (CPU backend): each frame's header, its layers straight from the cache and its checksum
  // trailer gathered into one write, no copy. Otherwise (CUDA) engine-thread copies into batch buffers.
  boost::asio::awaitable<bool> send_from_cache(PullSink& w, std::uint64_t id, const Lease& lease,
                                               std::uint32_t at, const Ready& ready, End& end);
  boost::asio::awaitable<bool> send_copied(PullSink& w, std::uint64_t id, const Lease& lease,
                                           std::uint32_t at, const Ready& ready, End& end);
  // Ends a pull with an error frame; returns false (the pull failed).
  boost::asio::awaitable<bool> send_error(PullSink& w, ErrorCode code, std::string message);

  // Blocks copied on the engine thread into the payloads of as many block frames back to back (headers and
  // checksums still to write).
  struct Batch {
    std::unique_ptr<char[]> bytes;
    std::size_t size = 0;
  };
  using Batches = http::AsyncQueue<Batch>;
  std::shared_ptr<Batches> start_read(boost::asio::any_io_executor ex, std::vector<BlockId> blocks);
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
  std::uint32_t per_send_ = 1;  // blocks per gathered write from the cache (about 1 MiB: still in L2 after
                                // the checksum pass when the kernel copies it)
  std::shared_ptr<BufferPool> buffers_ = std::make_shared<BufferPool>();
  std::unique_ptr<UcxPullServer> ucx_;  // reset first in the destructor: its handlers call serve_pull
};

}  // namespace kvfleet::pd
