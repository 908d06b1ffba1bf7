// Slow and greedy clients against HttpServer: separate head/body/idle deadlines, the per-peer
// connection cap, the accept loop out of descriptors, and disconnect detection while a handler runs
// after the client sent more than its request.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/resource.h>

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <vector>

#include "http_test_util.h"
#include "kvfleet/http/client.h"

using namespace kvfleet::http;
using namespace kvfleet::http::test;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer timer(co_await asio::this_coro::executor, d);
  co_await timer.async_wait(asio::use_awaitable);
}

struct WaitStats {
  std::atomic<int> saw_gone{0};
  std::atomic<int> finished{0};
};

// GET /wait?ms=N: waits up to N ms, or until the client is gone, then answers. POST /echo echoes.
HttpRouter test_router(WaitStats& stats) {
  HttpRouter router;
  router.get("/wait", [&stats](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
    int ms = std::stoi(request.query_param("ms").value_or("1000"));
    auto until = Clock::now() + std::chrono::milliseconds{ms};
    while (Clock::now() < until && !writer.client_gone()) co_await sleep_for(10ms);
    if (writer.client_gone()) ++stats.saw_gone;
    ++stats.finished;
    co_await writer.send(Response::text(200, request.target));
  });
  router.post("/echo", [](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
    co_await writer.send(Response::text(200, "echo " + request.body));
  });
  return router;
}

bool wait_for(const std::atomic<int>& value, int expected, std::chrono::milliseconds timeout) {
  auto until = Clock::now() + timeout;
  while (value.load() < expected && Clock::now() < until) std::this_thread::sleep_for(5ms);
  return value.load() >= expected;
}

HttpServerConfig deadline_config() {
  HttpServerConfig config = small_config();
  config.header_timeout = 300ms;
  config.body_timeout = 600ms;
  config.idle_timeout = 200ms;
  return config;
}

// Time until the server closes the connection, sending `bytes` one at a time every `gap` meanwhile
// (none when empty); `out` gets what it answered.
std::chrono::milliseconds time_to_close(RawSocket& socket, const std::string& bytes, std::chrono::milliseconds gap,
                                        std::string& out) {
  auto start = Clock::now();
  for (char c : bytes) {
    if (!socket.send_all(std::string(1, c)) || socket.poll_input(gap) != -1) break;
  }
  out = socket.read_until_close(3000ms);
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

}  // namespace

TEST_CASE("deadlines: a trickled head is 408 at header_timeout") {
  WaitStats stats;
  TestServer t(test_router(stats), deadline_config());
  RawSocket socket(t.port());
  std::string out;
  auto elapsed = time_to_close(socket, "GET /wait?ms=0 HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaa\r\n\r\n", 40ms, out);
  CHECK(status_of(out) == 408);
  CHECK(out.find("Connection: close") != std::string::npos);
  CHECK(elapsed >= 280ms);
  CHECK(elapsed < 1500ms);
  CHECK(http_request("127.0.0.1", t.port(), "GET", "/wait?ms=0").status == 200);
}

TEST_CASE("deadlines: a trickled body is 408 at body_timeout, counted from the end of the head") {
  WaitStats stats;
  TestServer t(test_router(stats), deadline_config());
  RawSocket socket(t.port());
  REQUIRE(socket.send_all("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"));
  std::string out;
  auto elapsed = time_to_close(socket, std::string(100, 'b'), 40ms, out);
  CHECK(status_of(out) == 408);
  CHECK(elapsed >= 550ms);  // the body's own 600 ms, not the head's 300
  CHECK(elapsed < 2000ms);
}

TEST_CASE("deadlines: idle keep-alive closes silently at idle_timeout, a silent new connection at header_timeout") {
  WaitStats stats;
  TestServer t(test_router(stats), deadline_config());
  SUBCASE("after a response") {
    RawSocket socket(t.port());
    REQUIRE(socket.send_all("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na"));
    REQUIRE(socket.poll_input(2000ms) == 1);
    char buf[4096];
    ssize_t n = ::recv(socket.fd(), buf, sizeof buf, 0);
    REQUIRE(n > 0);
    CHECK(status_of(std::string(buf, static_cast<size_t>(n))) == 200);
    std::string out;
    auto elapsed = time_to_close(socket, "", 0ms, out);
    CHECK(out.empty());
    CHECK(elapsed >= 150ms);
    CHECK(elapsed < 290ms + 500ms);
  }
  SUBCASE("nothing sent at all") {
    RawSocket socket(t.port());
    std::string out;
    auto elapsed = time_to_close(socket, "", 0ms, out);
    CHECK(out.empty());
    CHECK(elapsed >= 250ms);
    CHECK(elapsed < 1000ms);
  }
}

TEST_CASE("deadlines: read_timeout is the default of the three") {
  WaitStats stats;
  HttpServerConfig config = small_config();
  config.read_timeout = 250ms;
  TestServer t(test_router(stats), config);
  RawSocket socket(t.port());
  std::string out;
  auto elapsed = time_to_close(socket, "GET /wait HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n", 40ms, out);
  CHECK(status_of(out) == 408);
  CHECK(elapsed < 1500ms);
}

TEST_CASE("out of descriptors: the accept loop pauses instead of spinning, then serves the waiting client") {
  WaitStats stats;
  TestServer t(test_router(stats));
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  // Served before the descriptors run out: its answer read here, so that every thread and object the server
  // makes for a connection exists before, and only the accept of `waiting` meets the limit.
  RawSocket client(t.port());
  REQUIRE(client.send_all("GET /wait?ms=0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  CHECK(status_of(client.read_until_close(3000ms)) == 200);
  RawSocket waiting(t.port(), false);  // its descriptor now; it connects once none is left
  rlimit low = saved;
  low.rlim_cur = 256;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> filler;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) filler.push_back(fd);
  REQUIRE(errno == EMFILE);
  waiting.connect();  // the kernel completes it; the server's accept() fails with EMFILE
  REQUIRE(waiting.send_all("GET /wait?ms=0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));

  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(400ms);
  ::getrusage(RUSAGE_SELF, &after);
  auto cpu_us = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1'000'000L + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
  };
  long used_ms = (cpu_us(after) - cpu_us(before)) / 1000;
  for (int fd : filler) ::close(fd);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK(used_ms < 100);  // a spinning accept loop burns the whole 400 ms
  // Accepted by a later retry: asio's epoll is edge-triggered, so without one the connection
  // would wait in the backlog until another one arrived.
  CHECK(status_of(waiting.read_until_close(3000ms)) == 200);
}

TEST_CASE("disconnect watcher: a client that sends more than its request and leaves is noticed") {
  WaitStats stats;
  TestServer t(test_router(stats));
  SUBCASE("one extra byte, after the request was read") {
    RawSocket socket(t.port());
    REQUIRE(socket.send_all("GET /wait?ms=3000 HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::this_thread::sleep_for(100ms);  // the handler runs; the byte reaches the watcher
    REQUIRE(socket.send_all("X"));
    std::this_thread::sleep_for(50ms);
    socket.close_now();
  }
  SUBCASE("more than pipeline_limit") {
    RawSocket socket(t.port());
    REQUIRE(socket.send_all("GET /wait?ms=3000 HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::this_thread::sleep_for(50ms);
    socket.send_all(std::string(200 * 1024, 'g'));
    socket.close_now();
  }
  CHECK(wait_for(stats.saw_gone, 1, 1500ms));
  CHECK(wait_for(stats.finished, 1, 1500ms));
}

TEST_CASE("disconnect watcher: a pipelined request that arrives while the handler runs is still served") {
  WaitStats stats;
  TestServer t(test_router(stats));
  RawSocket socket(t.port());
  REQUIRE(socket.send_all("GET /wait?ms=300 HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::this_thread::sleep_for(100ms);  // the first handler runs; the watcher reads what follows
  REQUIRE(socket.send_in_pieces("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnext",
                                7, 5ms));
  std::string out = socket.read_until_close();
  CHECK(responses_in(out) == 2);
  size_t first = out.find("/wait?ms=300");
  size_t second = out.find("echo next");
  CHECK(first != std::string::npos);
  CHECK(second != std::string::npos);
  CHECK(first < second);
  CHECK(stats.saw_gone == 0);
}
