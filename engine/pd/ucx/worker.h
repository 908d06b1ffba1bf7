// UcxWorker: one UCP context and worker (UCX's stream API) driven by one thread of its own, and
// UcxEndpoint: one UCP stream endpoint whose sends and receives are awaitable from any Asio executor.
//
// Threading: a UCP worker is not thread-safe (UCS_THREAD_MODE_SINGLE, the fast mode), so every UCP call
// runs on the worker's thread: callers post() tasks, which the thread runs between ucp_worker_progress
// calls; it sleeps in epoll on ucp_worker_get_efd when idle and ucp_worker_signal wakes it (the one UCP
// call that is safe from any thread). Completions come back to the awaiting coroutine through an
// AsyncQueue on its executor. Nothing here ever blocks an engine or io thread.
//
// Deadlines: every send and receive has one; when it passes, the endpoint is closed by force, which
// makes UCX complete the pending operation with an error, so the awaiting coroutine always resumes
// after UCX is done with its buffer (a buffer is never freed under a pending operation).
//
// In a build without UCX (KVFLEET_UCX unset) create() returns nullptr with the reason.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace kvfleet::pd {

struct UcxEpState;
class UcxWorker;
struct PieceReceive;  // a receive of one pull's pieces ahead of the reader (receive_pieces)

// What a PieceReceive got so far: payload bytes in place, whether the closing piece came, and why it
// stopped when it failed (`reason` a fallback reason: peer_closed, malformed, timeout; "" while fine).
struct PieceProgress {
  std::size_t received = 0;
  bool done = false;
  std::string reason, why;
};

class UcxEndpoint {
 public:
  using Clock = std::chrono::steady_clock;
  UcxEndpoint(std::shared_ptr<UcxWorker> worker, std::shared_ptr<UcxEpState> state);
  ~UcxEndpoint();  // closes the UCP endpoint (on the worker thread)
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  // Sends `bytes` (kept alive by the caller until this returns). Throws PdFailure: "timeout" when the
  // deadline passed, "peer_closed" when the endpoint failed or was closed.
  boost::asio::awaitable<void> send(std::string_view bytes, Clock::time_point deadline);
  // Sends `pieces` one after the other as one operation (a UCP iov: no joining copy). As send().
  boost::asio::awaitable<void> send_gather(std::span<const std::string_view> pieces, Clock::time_point deadline);
  // Receives exactly `n` bytes into `into`. Throws as send().
  boost::asio::awaitable<void> recv(char* into, std::size_t n, Clock::time_point deadline);
  // Receives a pull's answer, pieces `u64 n | n bytes ... | u64 0`, into [base, base + capacity), the
  // payloads back to back: each piece's receive (its bytes and the next length, one UCP iov) is posted
  // from the completion of the one before, on the worker thread, so the bytes go from UCX's receive
  // segment straight into place (UCX copies data that arrives with no receive posted into a buffer of its
  // own, then again into the receive) while the reader checks what came before. `keep` (the memory's
  // owner) stays referenced until no receive is posted any more, so the memory outlives every UCX access
  // even when the reader gives up first. One per endpoint at a time, and no recv() meanwhile.
  boost::asio::awaitable<std::shared_ptr<PieceReceive>> receive_pieces(char* base, std::size_t capacity,
                                                                       std::shared_ptr<void> keep);
  // Waits for `r` to get further than `seen` bytes (or to end) and returns where it is. At the deadline
  // the endpoint is closed (which ends `r`) and the result says timeout.
  boost::asio::awaitable<PieceProgress> wait_pieces(std::shared_ptr<PieceReceive> r, std::size_t seen,
                                                    Clock::time_point deadline);
  // No more progress reports for `r` (its reader is going away); `r` itself ends with the endpoint.
  static void detach(PieceReceive& r);
  // Any thread: closes by force; pending and later operations fail.
  void close();
  // True once an operation failed or close() was called: the endpoint must not be reused.
  bool broken() const;

 private:
  enum class Op { send, send_iov, recv };
  // send_iov: `buffer` is an array of `n` UCP iov entries.
  boost::asio::awaitable<void> run(Op op, char* buffer, std::size_t n, Clock::time_point deadline);
  // Any thread: marks `s` broken and closes it by force on the worker thread (pending operations fail).
  static void close_by_force(const std::shared_ptr<UcxWorker>& w, const std::shared_ptr<UcxEpState>& s);

  std::shared_ptr<UcxWorker> worker_;
  std::shared_ptr<UcxEpState> state_;
};

class UcxWorker : public std::enable_shared_from_this<UcxWorker> {
 public:
  // nullptr (and `error` set) when UCX is not built in or cannot start here.
  static std::shared_ptr<UcxWorker> create(std::string& error);
  ~UcxWorker();  // closes every endpoint and listener, then stops the thread

  // A client endpoint to host:port (the UCP sockaddr connection manager). Returns at once: the
  // connection is established while the first operations are queued behind it; a refused or
  // unreachable peer makes them fail.
  std::shared_ptr<UcxEndpoint> connect(const std::string& host, std::uint16_t port);
  // Listens on host:port (0: any free port) and returns the port. Every connection request becomes an
  // endpoint handed to on_accept, called on the worker thread (it must only hand the endpoint on).
  // Throws std::runtime_error when UCX cannot listen there.
  std::uint16_t listen(const std::string& host, std::uint16_t port,
                       std::function<void(std::shared_ptr<UcxEndpoint>)> on_accept);
  // Runs task on the worker thread (between progress calls).
  void post(std::function<void()> task);

  struct Impl;

 private:
  friend class UcxEndpoint;  // its operations run on impl_'s thread
  UcxWorker() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvfleet::pd
