// HttpClient: one HTTP/1.1 connection driven by coroutines, for the router's upstream forwarding
// and for tests and the bench. A response body can be read whole, or piece by piece as it arrives
// (read_some), so an SSE stream can be relayed without buffering.
//
// Every operation has a deadline (connect_timeout, then io_timeout for each read or write); a
// failure or timeout throws boost::system::system_error and leaves the client closed.
//
// Threading: one HttpClient is used from one coroutine at a time, on the executor it was made
// with. close() must run on that executor too (from a ResponseWriter::on_disconnect callback of a
// handler that created the client with `co_await this_coro::executor`, it does); it aborts the
// pending operation, which then throws operation_aborted.
//
// GCC 12 caveat (for every coroutine API here): a braced aggregate temporary in a full expression
// that contains co_await, e.g. `co_await client.send(Request{...})`, is destroyed twice or read
// after its storage is reused. Build Request/Response/config objects as named variables first;
// function results (json_error(...)) are fine.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kvfleet/http/message.h"

namespace kvfleet::http {

// Limits on what the server may send (a replica can be hostile or broken); over one, the call
// throws system_error and the client is closed.
struct HttpClientConfig {
  std::chrono::milliseconds connect_timeout{5'000};
  std::chrono::milliseconds io_timeout{30'000};  // each read or write
  size_t header_limit = 64 * 1024;               // status line + all headers, across reads
  size_t trailer_limit = 8 * 1024;               // a chunked body's trailer section
  size_t chunk_extension_limit = 4 * 1024;       // all chunk extensions of one body
  size_t body_limit = 64 * 1024 * 1024;          // what read_body() may buffer; read_some: no limit
  size_t piece_size = 16 * 1024;                 // most bytes one read_some() returns; reads from the
                                                 // socket take max(64 KiB, piece_size) at a time
};

struct ResponseHead {
  int status = 0;
  Headers headers;
  bool chunked = false;
  std::optional<uint64_t> content_length;
  bool keep_alive = true;
};

class HttpClient {
 public:
  // Two constructors rather than a `config = {}` default: GCC 12 garbles that braced temporary when
  // the call sits in a coroutine (e.g. HttpClient c(co_await this_coro::executor)).
  explicit HttpClient(boost::asio::any_io_executor executor);
  HttpClient(boost::asio::any_io_executor executor, HttpClientConfig config);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // `host` is an IP address or a name to resolve.
  boost::asio::awaitable<void> connect(std::string host, uint16_t port);

  // Writes the request; Host and Content-Length are filled in when absent.
  boost::asio::awaitable<void> send(const Request& request);
  // Reads the status line and headers of the response to the last request sent.
  boost::asio::awaitable<ResponseHead> read_head();
  // The next body bytes as soon as some arrive (chunk framing removed); nullopt at the end.
  boost::asio::awaitable<std::optional<std::string>> read_some();
  // read_some without the copy into a string, for bulk bodies (KV transfer): the next body bytes
  // straight into `out`, at most out.size() (> 0) of them; 0 at the end of the body.
  boost::asio::awaitable<size_t> read_some_into(std::span<char> out);
  // read_some_into over several buffers, filled in order (one readv of a chunked body's data straight
  // into them: KV transfer lands each block's layers in their cache blocks); how many bytes, 0 at the end.
  boost::asio::awaitable<size_t> read_some_scattered(std::span<const std::span<char>> out);
  // The rest of the body; throws when it exceeds config.body_limit.
  boost::asio::awaitable<std::string> read_body();
  // send + read_head + read_body.
  boost::asio::awaitable<Response> request(const Request& request);

  // Aborts any pending operation and closes the connection. Idempotent.
  void close();
  bool is_open() const;

  // Connection reuse (keep-alive pools). True when the connection is open and the last response was
  // read to its end, framed cleanly (Content-Length or chunked, keep-alive), with no byte buffered
  // beyond it: another request may follow on it.
  bool reusable() const;
  boost::asio::any_io_executor executor() const;  // the one it was made with (a pool matches on it)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Synchronous one-shot request on a private io_context, for tests and tools. Throws
// boost::system::system_error on connection failure or timeout.
Response http_request(const std::string& host, uint16_t port, std::string method, std::string target,
                      std::string body = {}, Headers headers = {},
                      std::chrono::milliseconds timeout = std::chrono::milliseconds{10'000});

}  // namespace kvfleet::http
