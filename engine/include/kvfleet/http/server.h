// HttpServer: HTTP/1.1 on a Boost.Asio io_context run by N threads, one coroutine per connection.
//
// Each connection runs on its own strand, reads a request under a deadline (header and body
// together, so a client that trickles bytes is cut off with 408), enforces header (431) and body
// (413) limits, then hands the request to a Handler chosen by the HttpRouter. The handler answers
// through a ResponseWriter: one whole response, or a chunked stream (SSE) written piece by piece,
// each piece flushed at once under a write deadline. Keep-alive is supported; pipelined requests
// are answered in order.
//
// Threading:
//   - HttpServer::start(), stop(), port(), executor() and the destructor: any non-io thread
//     (stop() from an io thread would wait on itself).
//   - Handlers and every ResponseWriter call run on the connection's strand; a handler's
//     co_await-ed operations resume there as long as they use the coroutine's executor
//     (co_await boost::asio::this_coro::executor). Use AsyncQueue to receive items from other
//     threads.
//   - HttpRouter is filled before the server starts and only read afterwards.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "kvfleet/http/message.h"

namespace kvfleet::http {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port, see HttpServer::port()
  int io_threads = 2;
  std::chrono::milliseconds read_timeout{30'000};   // one whole request (or idle keep-alive wait)
  std::chrono::milliseconds write_timeout{30'000};  // each write (a response, or one stream piece)
  size_t header_limit = 16 * 1024;       // bytes of request line + headers; more -> 431
  size_t body_limit = 8 * 1024 * 1024;   // bytes of body; more -> 413
  size_t max_connections = 4096;         // more are accepted and closed at once
};

// The handler's side of one response. Every call returns false once the client is gone (a write
// failed or timed out, or the peer closed); a handler streaming work should then stop.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;

  // A whole response (Content-Length set for you). Call at most once, and not after begin_stream.
  virtual boost::asio::awaitable<bool> send(Response response) = 0;

  // Chunked streaming: the head now (e.g. Content-Type: text/event-stream), then write() pieces,
  // each sent as one chunk and flushed, then finish().
  virtual boost::asio::awaitable<bool> begin_stream(int status, Headers headers) = 0;
  virtual boost::asio::awaitable<bool> write(std::string_view piece) = 0;
  virtual boost::asio::awaitable<bool> finish() = 0;

  // True once the client disconnected (seen by a failed write or by EOF on the socket while the
  // handler runs, even when it writes nothing).
  virtual bool client_gone() const = 0;
  // Runs `callback` (on the connection's strand) when the client disconnects while the handler
  // runs; at once if it already has. One callback; a later call replaces it. Lets a handler that
  // waits on other work (an AsyncQueue) abort it, e.g. by closing the queue.
  virtual void on_disconnect(std::function<void()> callback) = 0;
  // True once send() or begin_stream() was called.
  virtual bool started() const = 0;
};

// The request and the writer outlive the handler's coroutine. An exception that escapes it
// becomes a 500 JSON error (or a closed connection when the response had already started).
using Handler = std::function<boost::asio::awaitable<void>(const Request&, ResponseWriter&)>;

// Exact method + path -> handler. Unknown path: 404; known path, other method: 405 with Allow.
class HttpRouter {
 public:
  HttpRouter& add(std::string method, std::string path, Handler handler);
  HttpRouter& get(std::string path, Handler h) { return add("GET", std::move(path), std::move(h)); }
  HttpRouter& post(std::string path, Handler h) { return add("POST", std::move(path), std::move(h)); }

  // The handler for the request, or one that answers the 404/405 JSON error.
  Handler route(const Request& request) const;

 private:
  std::map<std::string, std::map<std::string, Handler>, std::less<>> routes_;  // path -> method -> h
};

class HttpServer {
 public:
  HttpServer(HttpServerConfig config, HttpRouter router);
  ~HttpServer();  // stop() with a zero grace period
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the io threads. Throws boost::system::system_error on bind failure.
  void start();
  // The bound port (the ephemeral one when config.port was 0). Valid after start().
  uint16_t port() const;
  // The io_context's executor, e.g. for outgoing HttpClient connections.
  boost::asio::any_io_executor executor() const;

  // Graceful stop: stop accepting, close idle connections, let running requests (streams
  // included) finish within `grace`, then close what is left and join the io threads.
  // Returns true when every request finished in time. Idempotent.
  bool stop(std::chrono::milliseconds grace = std::chrono::milliseconds{5000});

  // Connections currently open (accounting/tests).
  size_t connection_count() const;

  struct State;  // shared with the connection coroutines (server.cpp / session.cpp)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kvfleet::http
