// Internal: one HTTP connection, run as a coroutine on its own strand (see server.h).
// session_read.cpp reads requests (limits, deadlines, checks); session.cpp serves them.
#pragma once

#include <array>
#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <functional>
#include <string>

#include "bounded_parser.h"
#include "request_checks.h"
#include "server_state.h"

namespace kvfleet::http {

// server.cpp: the connection's socket moved to an io thread's strand, with a new session that starts with
// `already_read` (the lane hands a kept-alive connection over after its first answer).
void to_io_threads(HttpServer::State& server, boost::asio::ip::tcp::socket socket, std::string_view already_read);

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::State& server, boost::asio::ip::tcp::socket socket);
  ~Session();

  boost::asio::any_io_executor executor() { return stream_.get_executor(); }

  // Reads requests and answers them until the connection ends.
  boost::asio::awaitable<void> run();

  // On the strand: the server stops. Closes the connection if it waits for a request that has
  // not begun; a running request finishes and the connection closes after it.
  void on_server_stop();
  // On the strand: the grace period is over.
  void force_close();
  // On the strand: closed for a newcomer past a connection cap (connection_caps.cpp). Closes the
  // connection, without an answer, if it still has not finished a request head.
  void evict();
  // Before run(): this connection takes a probe reserve slot; it serves one request on a priority
  // path and answers anything else 503.
  void set_probe_only() { probe_only_ = true; }
  // Before run(): a connection of the priority lane (its first request is on a priority path, served on
  // the lane's thread). After that answer a kept-alive connection goes on on the io threads (a new
  // session, with what was already read of its next request), so the lane never carries other work.
  void set_lane() { lane_ = true; }
  // Before run(): bytes of the connection read by an earlier session (the lane's).
  void set_already_read(std::string_view bytes) {
    if (bytes.empty()) return;
    auto space = buffer_.prepare(bytes.size());
    boost::asio::buffer_copy(space, boost::asio::buffer(bytes));
    buffer_.commit(bytes.size());
  }
  // Before run(): when it was accepted (its first head's deadline counts from then).
  void set_accepted_at(std::chrono::steady_clock::time_point at) { accepted_at_ = at; }

  // Before run(): where this connection's activity is kept (connection_caps.cpp).
  void set_activity_slot(ActivitySlot* slot) { activity_ = slot; }

  // Bytes of a pipelined next request kept while a handler runs; more are discarded.
  static constexpr size_t pipeline_limit = 64 * 1024;

 private:
  friend class SessionWriter;
  using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;
  using Clock = std::chrono::steady_clock;
  enum class Phase { idle, head, body, serving };
  enum class ReadResult { data, timeout, closed };

  // session_read.cpp
  // True with a whole request; false: answer `failure` if it has a status, then close.
  boost::asio::awaitable<bool> read_request(Request& request, bool& keep_alive, ReadFailure& failure);
  boost::asio::awaitable<ReadResult> read_more(Clock::time_point deadline);
  boost::asio::awaitable<bool> write_continue();
  std::chrono::milliseconds timeout_or_default(std::chrono::milliseconds timeout) const;

  // session.cpp
  boost::asio::awaitable<bool> write_error(int status, std::string_view message);
  boost::asio::awaitable<void> linger_close();
  boost::asio::awaitable<bool> serve(const Request& request, bool keep_alive);
  boost::asio::awaitable<void> watch_disconnect(uint64_t generation);
  void take_pipelined();
  void mark_gone();
  void set_phase(Phase phase);
  void touch() {
    if (activity_) activity_->last_active.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }

  HttpServer::State& server_;
  boost::beast::tcp_stream stream_;
  bool peer_loopback_ = false;  // the client's address is a loopback one
  boost::beast::flat_buffer buffer_;

  // Reading a request.
  BoundedParser<RequestParser> reader_;
  boost::asio::steady_timer deadline_timer_;
  uint64_t read_generation_ = 0;  // a late timer belongs to an earlier read
  bool timed_out_ = false;        // the current read was cancelled by its deadline
  bool reading_ = false;          // a socket read is pending
  Phase phase_ = Phase::idle;
  ActivitySlot* activity_ = nullptr;  // last activity, and whether phase_ is idle or head
  bool probe_only_ = false;
  bool lane_ = false;
  bool first_request_ = true;
  Clock::time_point accepted_at_;

  // Per request: disconnect detection while the handler runs.
  bool client_gone_ = false;
  std::function<void()> on_disconnect_;
  uint64_t watch_generation_ = 0;
  boost::asio::cancellation_signal watch_cancel_;
  bool watching_ = false;               // the watcher coroutine runs
  boost::asio::steady_timer watch_done_;  // cancelled when it ends
  std::array<char, 4096> watch_buffer_{};
  std::string pipelined_;  // what the watcher read: the start of the next request
  bool discarded_ = false;  // the watcher dropped bytes: the connection ends after this request
};

}  // namespace kvfleet::http
