// Helpers for the HTTP tests: a server on an ephemeral loopback port, running a coroutine to
// completion, and a raw POSIX socket for byte-level misbehaviour (slow or oversized clients).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/json/parse.hpp>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "kvfleet/http/server.h"

namespace kvfleet::http::test {

// Small limits and short deadlines so that every limit test runs in well under a second.
inline HttpServerConfig small_config() {
  HttpServerConfig config;
  config.io_threads = 2;
  config.read_timeout = std::chrono::milliseconds{2000};
  config.write_timeout = std::chrono::milliseconds{2000};
  config.header_limit = 2048;
  config.body_limit = 4096;
  return config;
}

struct TestServer {
  explicit TestServer(HttpRouter router, HttpServerConfig config = small_config())
      : server(std::move(config), std::move(router)) {
    server.start();
  }
  uint16_t port() const { return server.port(); }
  HttpServer server;
};

// Runs one coroutine on a private io_context and returns its result (rethrowing its exception).
template <typename T>
T run_sync(boost::asio::awaitable<T> coroutine) {
  boost::asio::io_context ioc;
  auto future = boost::asio::co_spawn(ioc, std::move(coroutine), boost::asio::use_future);
  ioc.run();
  return future.get();
}

// The "error" object of an OpenAI-style error body.
inline boost::json::object error_of(const std::string& body) {
  return boost::json::parse(body).as_object().at("error").as_object();
}

// A blocking loopback socket with a receive timeout; closes on destruction.
class RawSocket {
 public:
  // `from`: the client's own loopback address (e.g. "127.0.0.2": another peer to the server).
  explicit RawSocket(uint16_t port, bool connect_now = true, const char* from = nullptr) : port_(port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (from) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &local.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) throw std::runtime_error("bind failed");
    }
    if (connect_now) connect();
  }
  // Connects the socket made by the constructor (needs no new descriptor).
  void connect() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      throw std::runtime_error("connect failed");
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawSocket() { close_now(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  // false when the peer has closed (EPIPE/ECONNRESET).
  bool send_all(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Sends `bytes` in pieces of `piece` bytes with `pause` between them, so that the server sees
  // many short reads (Beast-style partial writes). False when the peer has closed.
  bool send_in_pieces(std::string_view bytes, size_t piece, std::chrono::milliseconds pause) {
    while (!bytes.empty()) {
      size_t n = std::min(piece, bytes.size());
      if (!send_all(bytes.substr(0, n))) return false;
      bytes.remove_prefix(n);
      if (!bytes.empty()) std::this_thread::sleep_for(pause);
    }
    return true;
  }

  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }

  // Waits up to `timeout` for input. Returns: 1 data, 0 EOF/reset, -1 nothing yet.
  int poll_input(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return -1;
    char byte;
    ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 ? 1 : 0;
  }

  // Everything until the peer closes, or until `timeout` passes without input.
  std::string read_until_close(std::chrono::milliseconds timeout = std::chrono::milliseconds{3000}) {
    std::string out;
    char buf[4096];
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) break;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// The status code of the first response in `raw` ("HTTP/1.1 431 ..." -> 431), 0 when there is none.
inline int status_of(const std::string& raw) {
  if (!raw.starts_with("HTTP/1.1 ") || raw.size() < 12) return 0;
  return std::stoi(raw.substr(9, 3));
}

// How many responses (status lines) `raw` holds.
inline int responses_in(const std::string& raw) {
  int count = 0;
  for (size_t at = raw.find("HTTP/1.1 "); at != std::string::npos; at = raw.find("HTTP/1.1 ", at + 1)) ++count;
  return count;
}

// A hostile HTTP server for client tests: accepts one connection on an ephemeral loopback port,
// reads the request head, sends `response` in pieces, then closes. Stops by itself.
class RawServer {
 public:
  explicit RawServer(std::string response, size_t piece = 1 << 20,
                     std::chrono::milliseconds pause = std::chrono::milliseconds{0}) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listen_fd_, 4);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, response = std::move(response), piece, pause] { serve(response, piece, pause); });
  }
  ~RawServer() {
    thread_.join();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }

 private:
  void serve(const std::string& response, size_t piece, std::chrono::milliseconds pause) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return;
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos) {
      pollfd q{fd, POLLIN, 0};
      if (::poll(&q, 1, 5000) <= 0) break;
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    std::string_view rest = response;
    while (!rest.empty()) {
      size_t n = std::min(piece, rest.size());
      if (::send(fd, rest.data(), n, MSG_NOSIGNAL) <= 0) break;
      rest.remove_prefix(n);
      if (pause.count() > 0) std::this_thread::sleep_for(pause);
    }
    ::shutdown(fd, SHUT_WR);
    pollfd q{fd, POLLIN, 0};
    ::poll(&q, 1, 2000);  // until the client closes (or 2 s)
    ::close(fd);
  }

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace kvfleet::http::test
