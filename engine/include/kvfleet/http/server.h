// HttpServer: HTTP/1.1 on a Boost.Asio io_context run by N threads, one coroutine per connection.
//
// Each connection runs on its own strand and reads a request through our own limits and deadlines
// (HttpServerConfig; Beast's alone do not hold, see bounded_parser.h), then hands it to a Handler
// chosen by the HttpRouter. The handler answers through a ResponseWriter: one whole response, or a
// chunked stream (SSE) written piece by piece, each piece flushed at once under a write deadline.
// Keep-alive is supported; pipelined requests are answered in order.
//
// What a request must pass (each failure is an OpenAI-style JSON error, then the connection closes):
//   - header_limit (16 KiB): the request line and all header fields together, however many reads
//     they take -> 431. trailer_limit (8 KiB): a chunked body's trailers -> 431 (trailers are
//     parsed and dropped, never merged into the headers). chunk_extension_limit (4 KiB): the chunk
//     extensions of one body -> 400. body_limit (8 MiB) -> 413, before reading any of the body when
//     Content-Length says so (also with Expect: 100-continue, whose 100 is then never sent).
//   - Framing (RFC 9112, against request smuggling): Transfer-Encoding must end in chunked (400),
//     other codings are not supported (501), no Content-Length with it (400), one valid
//     Content-Length (400). HTTP/1.1 needs exactly one Host (400).
//   - Deadlines: header_timeout (10 s, or read_timeout when that is shorter), body_timeout (408 once
//     a request has begun), idle_timeout between requests (silent close); the last two default to
//     read_timeout (30 s). write_timeout (30 s) per write.
//   - Connections: max_connections (4096) in all, max_connections_per_peer per client address (half
//     of max_connections unless set; 0: no cap). A connection over a cap closes a half-request in its
//     place: the one of its address (over the address's cap) or of the address holding the most
//     connections (over max_connections) whose last activity is oldest. A half-request is a
//     connection that has not finished its request head (idle keep-alive connections included); it
//     closes without an answer. With no half-request to close, the new connection takes one of
//     probe_reserve spare slots, where only priority_paths (health probes, metrics, admin) are
//     served and anything else is answered 503; with none left it is closed at once. The accept loop
//     takes up to 256 queued connections per wake-up (a probe must not wait in the kernel's queue
//     behind a flood's connections); on EMFILE/ENFILE it pauses (accept_backoff, 50 ms, doubling up
//     to 1 s) instead of spinning.
//   - `Expect: 100-continue` gets `100 Continue` once the head passed its checks.
//
// The priority lane (with priority_paths set): the acceptor runs on an io_context and thread of its own,
// which also looks at each new connection's first bytes without consuming them. A connection whose first
// request line names a priority path is served on that thread (that request only: kept alive, the
// connection then goes on on the io threads, with what was read of its next request); every other connection (other paths, a request line not complete in its first bytes, or no bytes within
// 250 ms) goes to the io threads, which read its request from the first byte. So a probe on a new
// connection waits neither for the io threads' queue of a flood's reads and writes nor for its accept.
// Without priority_paths, connections go straight to the io threads.
// An exception in one connection (Beast, a handler, our code) ends that connection only, logged.
//
// While a handler runs, the connection is still read: bytes of a pipelined next request are kept
// (up to 64 KiB; beyond that they are discarded and the connection closes after this response), so
// a client that leaves is noticed (client_gone(), on_disconnect) even after it sent more data.
//
// Threading:
//   - io_threads threads run the connections; one more runs the acceptor and the priority lane.
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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvfleet/http/message.h"

namespace kvfleet::http {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port, see HttpServer::port()
  int io_threads = 2;
  // Read deadlines. Past one, a request that has begun is answered 408 (Connection: close); a
  // connection waiting for its next request is closed without a word. 0 for the three: read_timeout.
  std::chrono::milliseconds read_timeout{30'000};
  std::chrono::milliseconds header_timeout{0};  // request line + headers: from accept (a connection's
                                                 // first request) or from the first byte (later ones);
                                                 // 0: 10 s, or read_timeout when shorter
  std::chrono::milliseconds body_timeout{0};    // the whole body, from the end of the head
  std::chrono::milliseconds idle_timeout{0};    // keep-alive: from a response to the next first byte
  std::chrono::milliseconds write_timeout{30'000};  // each write (a response, or one stream piece)
  size_t header_limit = 16 * 1024;          // request line + all headers, across reads; more -> 431
  size_t trailer_limit = 8 * 1024;          // a chunked body's trailer section; more -> 431
  size_t chunk_extension_limit = 4 * 1024;  // all chunk extensions of one body; more -> 400
  size_t body_limit = 8 * 1024 * 1024;      // bytes of body; more -> 413 (at once from Content-Length)
  size_t max_connections = 4096;            // more are accepted and closed at once
  // Per client IP address; unset: max_connections / 2; 0: no cap. See the header comment.
  std::optional<size_t> max_connections_per_peer;
  size_t probe_reserve = 64;  // spare slots past a cap that serve priority_paths only
  // Paths served ahead of connection caps (exact, or a prefix when it ends in '/'); the query is ignored.
  std::vector<std::string> priority_paths;
  std::chrono::milliseconds accept_backoff{50};  // out of descriptors: first pause, doubled up to 1 s

  // The caps and the deadline in effect (the defaults above resolved).
  size_t peer_cap() const;
  std::chrono::milliseconds effective_header_timeout() const;
  bool is_priority_path(std::string_view target) const;
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
  // One chunk gathered from several pieces (one writev, no copy into one buffer): KV transfer sends a
  // block frame's header, the block's layers straight from the cache and its trailer this way. The
  // default writes them one by one.
  virtual boost::asio::awaitable<bool> write_pieces(std::span<const std::string_view> pieces);
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

// Exact method + path -> handler; then paths under a prefix (a resource's id: "/v1/responses/" + id),
// the longest prefix first. Unknown path: 404; known path, other method: 405 with Allow.
class HttpRouter {
 public:
  HttpRouter& add(std::string method, std::string path, Handler handler);
  HttpRouter& get(std::string path, Handler h) { return add("GET", std::move(path), std::move(h)); }
  HttpRouter& post(std::string path, Handler h) { return add("POST", std::move(path), std::move(h)); }
  // Every path that starts with `prefix` and is longer than it (exact paths win).
  HttpRouter& add_prefix(std::string method, std::string prefix, Handler handler);

  // The handler for the request, or one that answers the 404/405 JSON error.
  Handler route(const Request& request) const;

 private:
  std::map<std::string, std::map<std::string, Handler>, std::less<>> routes_;  // path -> method -> h
  std::map<std::string, std::map<std::string, Handler>, std::less<>> prefixes_;  // prefix -> method -> h
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
