// Connection caps (engine/core/http/connection_caps.cpp): past a cap the oldest half-request closes, not
// the newcomer; busy connections are never closed; with none to close, the probe reserve serves priority
// paths only. Two client addresses are two loopback addresses (127.0.0.1 and 127.0.0.2).
#include <doctest/doctest.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "http_test_util.h"

using namespace kvfleet::http;
using namespace kvfleet::http::test;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

// GET /wait?ms=N answers after N ms; GET /health at once.
HttpRouter caps_router() {
  HttpRouter router;
  router.get("/wait", [](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
    asio::steady_timer timer(co_await asio::this_coro::executor,
                             std::chrono::milliseconds{std::stoi(request.query_param("ms").value_or("0"))});
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    co_await writer.send(Response::text(200, "waited"));
  });
  router.get("/health", [](const Request&, ResponseWriter& writer) -> asio::awaitable<void> {
    co_await writer.send(Response::text(200, "ok"));
  });
  return router;
}

HttpServerConfig caps_config(size_t per_peer, size_t total = 4096) {
  HttpServerConfig config = small_config();
  config.max_connections = total;
  config.max_connections_per_peer = per_peer;
  config.priority_paths = {"/health"};
  return config;
}

// Until the server has registered `n` connections (accepts run on the server's threads).
bool connections_reach(const TestServer& t, size_t n) {
  const auto until = Clock::now() + 2000ms;
  while (t.server.connection_count() != n && Clock::now() < until) std::this_thread::sleep_for(2ms);
  return t.server.connection_count() == n;
}

// One response: its head, then as many body bytes as its Content-Length says ("" when none came).
std::string read_response(RawSocket& socket, std::chrono::milliseconds timeout = 3000ms) {
  std::string out;
  char buf[4096];
  for (;;) {
    const size_t end = out.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t at = out.find("Content-Length: ");
      const size_t length = at == std::string::npos ? 0 : std::stoul(out.substr(at + 16));
      if (out.size() >= end + 4 + length) return out;
    }
    pollfd p{socket.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return out;
    const ssize_t n = ::recv(socket.fd(), buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

std::string get(RawSocket& socket, const std::string& target, bool close = false) {
  const std::string head = "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + (close ? "Connection: close\r\n" : "") + "\r\n";
  if (!socket.send_all(head)) return {};
  return read_response(socket);
}

}  // namespace

TEST_CASE("per-peer cap: a newcomer closes its address's idlest half-request, not itself") {
  TestServer t(caps_router(), caps_config(2));
  RawSocket idlest(t.port());  // a slowloris: part of a head, then nothing
  REQUIRE(idlest.send_all("GET /wait HTTP/1.1\r\nHo"));
  REQUIRE(connections_reach(t, 1));
  std::this_thread::sleep_for(20ms);
  RawSocket kept_alive(t.port());  // served, then idle: a half-request whose activity is newer
  CHECK(status_of(get(kept_alive, "/wait?ms=0")) == 200);
  RawSocket newcomer(t.port());
  CHECK(idlest.read_until_close(2000ms).empty());  // closed without a word
  CHECK(status_of(get(newcomer, "/wait?ms=0")) == 200);
  CHECK(status_of(get(kept_alive, "/wait?ms=0")) == 200);
  // Another address is not touched by this one's cap.
  RawSocket other(t.port(), true, "127.0.0.2");
  CHECK(status_of(get(other, "/wait?ms=0", true)) == 200);
  CHECK(kept_alive.poll_input(50ms) == -1);
}

TEST_CASE("per-peer cap: busy connections are never closed; past the cap the probe reserve serves probes only") {
  HttpServerConfig config = caps_config(2);
  config.probe_reserve = 1;
  TestServer t(caps_router(), config);
  RawSocket busy1(t.port()), busy2(t.port());
  REQUIRE(busy1.send_all("GET /wait?ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n"));
  REQUIRE(busy2.send_all("GET /wait?ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n"));
  REQUIRE(connections_reach(t, 2));
  std::this_thread::sleep_for(50ms);  // both heads read: they are being served
  RawSocket reserved(t.port());       // the reserve's one slot
  REQUIRE(connections_reach(t, 3));
  RawSocket refused(t.port());  // nothing left: closed at once
  CHECK(refused.poll_input(1000ms) == 0);
  // The reserve answers a probe, and closes after it.
  const std::string probe = get(reserved, "/health");
  CHECK(status_of(probe) == 200);
  CHECK(probe.find("Connection: close") != std::string::npos);
  REQUIRE(connections_reach(t, 2));  // the probe's reserve slot is free again
  RawSocket not_a_probe(t.port());
  const std::string refused_work = not_a_probe.send_all("GET /wait?ms=0 HTTP/1.1\r\nHost: x\r\n\r\n")
                                       ? not_a_probe.read_until_close(2000ms) : std::string();
  CHECK(status_of(refused_work) == 503);
  CHECK(refused_work.find("connection limit") != std::string::npos);
  // The busy ones finish undisturbed.
  CHECK(status_of(read_response(busy1)) == 200);
  CHECK(status_of(read_response(busy2)) == 200);
  CHECK(status_of(get(busy2, "/wait?ms=0")) == 200);
}

TEST_CASE("max_connections: the address holding the most connections gives up its idlest half-request") {
  TestServer t(caps_router(), caps_config(3, 3));
  RawSocket heavy_old(t.port()), heavy_new(t.port());
  REQUIRE(connections_reach(t, 2));
  std::this_thread::sleep_for(20ms);
  REQUIRE(heavy_new.send_all("G"));  // newer activity than heavy_old
  RawSocket light(t.port(), true, "127.0.0.2");
  REQUIRE(connections_reach(t, 3));
  std::this_thread::sleep_for(20ms);
  RawSocket light_newcomer(t.port(), true, "127.0.0.2");
  CHECK(heavy_old.read_until_close(2000ms).empty());  // closed without a word
  CHECK(status_of(get(light_newcomer, "/wait?ms=0")) == 200);
  CHECK(status_of(get(light, "/wait?ms=0")) == 200);
  CHECK(heavy_new.send_all("ET /wait?ms=0 HTTP/1.1\r\nHost: x\r\n\r\n"));
  CHECK(heavy_new.poll_input(2000ms) == 1);
}

TEST_CASE("max_connections_per_peer: 0 turns the cap off; unset, it is half of max_connections") {
  HttpServerConfig config;
  config.max_connections = 100;
  CHECK(config.peer_cap() == 50);
  config.max_connections_per_peer = 0;
  CHECK(config.peer_cap() == 0);
  TestServer t(caps_router(), caps_config(0, 4096));
  std::vector<std::unique_ptr<RawSocket>> many;
  for (int i = 0; i < 20; ++i) many.push_back(std::make_unique<RawSocket>(t.port()));
  REQUIRE(connections_reach(t, 20));
  for (auto& s : many) CHECK(s->poll_input(0ms) == -1);  // none closed
}

TEST_CASE("header deadline: 10 s, or read_timeout when shorter; set, it wins") {
  HttpServerConfig config;
  CHECK(config.effective_header_timeout() == 10'000ms);
  config.read_timeout = 250ms;
  CHECK(config.effective_header_timeout() == 250ms);
  config.header_timeout = 100ms;
  CHECK(config.effective_header_timeout() == 100ms);
  CHECK(config.is_priority_path("/x") == false);
  config.priority_paths = {"/health", "/admin/"};
  CHECK(config.is_priority_path("/health?verbose=1"));
  CHECK(config.is_priority_path("/admin/replicas"));
  CHECK(!config.is_priority_path("/healthz"));
  CHECK(!config.is_priority_path("/admin"));
}

TEST_CASE("header deadline: a head that trickles in is cut at header_timeout though the body's is longer") {
  HttpServerConfig config = caps_config(0);
  config.header_timeout = 300ms;
  config.body_timeout = 3000ms;
  TestServer t(caps_router(), config);
  RawSocket slow(t.port());
  const auto start = Clock::now();
  const std::string head = "GET /wait?ms=0 HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
  for (char c : head) {
    if (!slow.send_all(std::string(1, c)) || slow.poll_input(40ms) != -1) break;
  }
  const std::string out = slow.read_until_close(2000ms);
  CHECK(status_of(out) == 408);
  CHECK(Clock::now() - start < 1500ms);
}
