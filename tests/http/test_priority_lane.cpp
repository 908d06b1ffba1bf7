// The priority lane (server.h): a new connection whose first request is on a priority path is served by
// the lane's thread, so it is answered while every io thread is held; any other request waits for the io
// threads, and the lane hands it over whole (nothing of its head is lost), as it does a probe's connection
// after its first answer.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "http_test_util.h"

using namespace kvfleet::http;
using namespace kvfleet::http::test;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

// Holds the io thread that runs it until released: a stand-in for io threads saturated by a flood.
class Gate {
 public:
  void hold() {
    std::unique_lock lock(mu_);
    ++held_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  bool wait_held(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 5s, [&] { return held_ >= n; });
  }
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int held_ = 0;
  bool open_ = false;
};

HttpRouter lane_router(Gate& gate) {
  HttpRouter router;
  router.get("/hold", [&gate](const Request&, ResponseWriter& writer) -> asio::awaitable<void> {
    gate.hold();  // blocks the io thread on purpose
    co_await writer.send(Response::text(200, "held"));
  });
  router.get("/health", [](const Request&, ResponseWriter& writer) -> asio::awaitable<void> {
    co_await writer.send(Response::text(200, "ok"));
  });
  router.get("/work", [](const Request&, ResponseWriter& writer) -> asio::awaitable<void> {
    co_await writer.send(Response::text(200, "work"));
  });
  return router;
}

std::string exchange(RawSocket& socket, const std::string& target, std::chrono::milliseconds timeout) {
  if (!socket.send_all("GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n")) return {};
  std::string out;
  char buf[4096];
  const auto until = Clock::now() + timeout;
  while (out.find("\r\n\r\n") == std::string::npos || out.find("\r\n\r\n") + 4 >= out.size()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left <= 0ms || socket.poll_input(left) != 1) break;
    const ssize_t n = ::recv(socket.fd(), buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

TEST_CASE("priority lane: with every io thread held, a probe on a new connection is answered; other work waits") {
  Gate gate;
  HttpServerConfig config = small_config();
  config.priority_paths = {"/health"};
  TestServer t(lane_router(gate), config);
  RawSocket h1(t.port()), h2(t.port());
  REQUIRE(h1.send_all("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"));
  REQUIRE(h2.send_all("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"));
  REQUIRE(gate.wait_held(2));  // both io threads are now stuck in a handler

  for (int i = 0; i < 5; ++i) {
    RawSocket probe(t.port());
    const std::string answer = exchange(probe, "/health", 2000ms);
    CHECK(answer.rfind("HTTP/1.1 200", 0) == 0);
  }
  RawSocket work(t.port());
  CHECK(exchange(work, "/work", 300ms).empty());  // its head went to the io threads, which are held
  gate.open();
  std::string rest;
  char buf[4096];
  while (rest.find("work") == std::string::npos && work.poll_input(2000ms) == 1) {
    const ssize_t n = ::recv(work.fd(), buf, sizeof buf, 0);
    if (n <= 0) break;
    rest.append(buf, static_cast<size_t>(n));
  }
  CHECK(rest.rfind("HTTP/1.1 200", 0) == 0);  // answered once they are free, its request intact
  CHECK(rest.find("work") != std::string::npos);
}

TEST_CASE("priority lane: kept-alive and pipelined probes' connections go on; a silent start or a split path is served too") {
  Gate gate;
  gate.open();
  HttpServerConfig config = small_config();
  config.priority_paths = {"/health"};
  TestServer t(lane_router(gate), config);
  RawSocket quiet(t.port());
  std::this_thread::sleep_for(400ms);  // past the lane's wait for first bytes: handed to the io threads
  CHECK(exchange(quiet, "/work", 2000ms).rfind("HTTP/1.1 200", 0) == 0);
  CHECK(exchange(quiet, "/health", 2000ms).rfind("HTTP/1.1 200", 0) == 0);  // kept alive there
  // A probe's connection kept alive: its next requests go on on the io threads, pipelined ones included.
  RawSocket kept(t.port());
  CHECK(exchange(kept, "/health", 2000ms).rfind("HTTP/1.1 200", 0) == 0);
  CHECK(exchange(kept, "/work", 2000ms).find("work") != std::string::npos);
  CHECK(exchange(kept, "/health", 2000ms).rfind("HTTP/1.1 200", 0) == 0);
  RawSocket pipelined(t.port());
  REQUIRE(pipelined.send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /work HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string both;
  char chunk[4096];
  while (both.find("work") == std::string::npos && pipelined.poll_input(2000ms) == 1) {
    const ssize_t n = ::recv(pipelined.fd(), chunk, sizeof chunk, 0);
    if (n <= 0) break;
    both.append(chunk, static_cast<size_t>(n));
  }
  CHECK(both.find("ok") != std::string::npos);
  CHECK(both.find("work") != std::string::npos);
  RawSocket split(t.port());
  REQUIRE(split.send_all("GET /hea"));
  std::this_thread::sleep_for(50ms);
  REQUIRE(split.send_all("lth HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string out;
  char buf[4096];
  while (out.find("ok") == std::string::npos && split.poll_input(2000ms) == 1) {
    const ssize_t n = ::recv(split.fd(), buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  CHECK(out.rfind("HTTP/1.1 200", 0) == 0);
}
