// Hostile requests against HttpServer over raw loopback sockets: limits on the whole head, trailers
// and chunk extensions, request smuggling, Host and Expect. Each answer is checked on the wire, and
// the server must still serve others afterwards.
#include <doctest/doctest.h>

#include "http_test_util.h"
#include "kvfleet/http/client.h"
#include "kvfleet/http/sse.h"

using namespace kvfleet::http;
using namespace kvfleet::http::test;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

HttpRouter echo_router() {
  HttpRouter router;
  router.post("/echo", [](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
    std::string headers;
    for (const auto& f : request.headers.fields()) headers += f.name + ";";
    Response response = Response::text(200, "body=" + request.body + " headers=" + headers);
    co_await writer.send(std::move(response));
  });
  router.get("/health", [](const Request&, ResponseWriter& writer) -> asio::awaitable<void> {
    co_await writer.send(Response::json(200, R"({"status":"ok"})"));
  });
  return router;
}

bool healthy(uint16_t port) { return http_request("127.0.0.1", port, "GET", "/health").status == 200; }

// Sends `raw` (in pieces of `piece` bytes) and returns everything the server sent until it closed.
std::string exchange(uint16_t port, const std::string& raw, size_t piece = 1 << 20,
                     std::chrono::milliseconds pause = 0ms) {
  RawSocket socket(port);
  socket.send_in_pieces(raw, piece, pause);
  return socket.read_until_close();
}

const std::string kChunkedHead = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
const std::string kSmuggled = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

}  // namespace

TEST_CASE("a trailer field over 64 KiB is 431, and the process lives") {
  TestServer t(echo_router());
  std::string request = kChunkedHead + "1\r\na\r\n0\r\nX-Big: " + std::string(70'000, 't') + "\r\n\r\n";
  SUBCASE("in one write") { CHECK(status_of(exchange(t.port(), request)) == 431); }
  SUBCASE("in 1000-byte writes") { CHECK(status_of(exchange(t.port(), request, 1000, 1ms)) == 431); }
  CHECK(healthy(t.port()));
}

TEST_CASE("trailers are bounded by trailer_limit and never become headers") {
  HttpServerConfig config = small_config();
  config.trailer_limit = 1024;
  TestServer t(echo_router(), config);
  std::string big = kChunkedHead + "1\r\na\r\n0\r\nX-T: " + std::string(1500, 't') + "\r\n\r\n";
  CHECK(status_of(exchange(t.port(), big, 100, 1ms)) == 431);
  std::string fine = kChunkedHead + "1\r\na\r\n0\r\nX-Trailer: v\r\nConnection: close\r\n\r\n";
  std::string out = exchange(t.port(), fine);
  CHECK(status_of(out) == 200);
  CHECK(out.find("body=a ") != std::string::npos);
  CHECK(out.find("X-Trailer") == std::string::npos);
}

TEST_CASE("headers trickled over many reads are limited as a whole") {
  TestServer t(echo_router());  // header_limit 2048
  std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 100; ++i) head += "X-F" + std::to_string(i) + ": aaaaaaaaaaaaaaaaaaaa\r\n";  // ~3 KB
  head += "\r\n";
  CHECK(status_of(exchange(t.port(), head, 40, 1ms)) == 431);
  CHECK(status_of(exchange(t.port(), head)) == 431);
  // Beast consumes the request line on its own, then applies its limit to the fields alone: a
  // 1.5 KB target plus 1.2 KB of fields passed a 2 KiB limit.
  std::string long_target = "GET /health?" + std::string(1500, 'q') + " HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 40; ++i) long_target += "X-F" + std::to_string(i) + ": aaaaaaaaaaaaaaaaaaaa\r\n";
  long_target += "\r\n";
  CHECK(status_of(exchange(t.port(), long_target)) == 431);
  CHECK(healthy(t.port()));
}

TEST_CASE("a head of exactly header_limit bytes passes, one byte more is 431") {
  HttpServerConfig config = small_config();
  TestServer t(echo_router(), config);
  auto head_of = [](size_t size) {  // a head of exactly `size` bytes
    const std::string start = "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ", end = "\r\n\r\n";
    return start + std::string(size - start.size() - end.size(), 'p') + end;
  };
  std::string exact = head_of(config.header_limit);
  REQUIRE(exact.size() == config.header_limit);
  CHECK(status_of(exchange(t.port(), exact, 50, 1ms)) == 200);
  std::string over = head_of(config.header_limit + 1);
  CHECK(status_of(exchange(t.port(), over, 50, 1ms)) == 431);
}

TEST_CASE("chunk extensions are limited") {
  TestServer t(echo_router());  // chunk_extension_limit 4 KiB
  SUBCASE("one long extension is 400") {
    std::string request = kChunkedHead + "1;" + std::string(60'000, 'e') + "\r\na\r\n0\r\n\r\n";
    std::string out = exchange(t.port(), request, 4096, 1ms);
    CHECK(status_of(out) == 400);
    CHECK(out.find("chunk extensions are too long") != std::string::npos);
  }
  SUBCASE("many short ones add up") {
    std::string request = kChunkedHead;
    for (int i = 0; i < 10; ++i) request += "1;" + std::string(500, 'e') + "\r\na\r\n";
    request += "0\r\n\r\n";
    CHECK(status_of(exchange(t.port(), request)) == 400);
  }
  SUBCASE("a few small ones are fine") {
    std::string request = kChunkedHead + "1;name=value\r\na\r\n2;x\r\nbc\r\n0;last\r\n\r\n";
    std::string out = exchange(t.port(), request.replace(request.find("\r\n\r\n"), 4, "\r\nConnection: close\r\n\r\n"));
    CHECK(status_of(out) == 200);
    CHECK(out.find("body=abc ") != std::string::npos);
  }
  CHECK(healthy(t.port()));
}

TEST_CASE("request smuggling: an unusable Transfer-Encoding or Content-Length is refused, and nothing after it runs") {
  TestServer t(echo_router());
  struct Case {
    std::string headers;
    int status;
  };
  const Case cases[] = {
      {"Transfer-Encoding: identity\r\n", 400},
      {"Transfer-Encoding: gzip\r\n", 400},
      {"Transfer-Encoding: chunked, identity\r\n", 400},
      {"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", 400},
      {"Transfer-Encoding: chunked, chunked\r\n", 400},
      {"Transfer-Encoding: gzip, chunked\r\n", 501},
      {"Transfer-Encoding: \r\n", 400},
      {"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", 400},
      {"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", 400},
      {"Transfer-Encoding: identity\r\nContent-Length: 3\r\n", 400},
      {"Content-Length: 3\r\nContent-Length: 3\r\n", 400},
      {"Content-Length: 3\r\nContent-Length: 4\r\n", 400},
      {"Content-Length: 3, 3\r\n", 400},
      {"Content-Length: +3\r\n", 400},
      {"Content-Length: -1\r\n", 400},
      {"Content-Length: 0x3\r\n", 400},
      {"Content-Length: 99999999999999999999999\r\n", 400},
      {"Content-Length: \r\n", 400},
  };
  for (const Case& c : cases) {
    CAPTURE(c.headers);
    std::string out = exchange(t.port(), "POST /echo HTTP/1.1\r\nHost: x\r\n" + c.headers + "\r\nabc" + kSmuggled);
    CHECK(status_of(out) == c.status);
    CHECK(responses_in(out) == 1);  // the smuggled GET never ran
    CHECK(out.find("Connection: close") != std::string::npos);
    CHECK(out.find("\"error\"") != std::string::npos);
  }
  SUBCASE("HTTP/1.0 with Transfer-Encoding") {
    std::string out = exchange(t.port(), "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n");
    CHECK(status_of(out) == 400);
  }
  CHECK(healthy(t.port()));
}

TEST_CASE("Host: required once in HTTP/1.1") {
  TestServer t(echo_router());
  CHECK(status_of(exchange(t.port(), "GET /health HTTP/1.1\r\n\r\n")) == 400);
  CHECK(status_of(exchange(t.port(), "GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")) == 400);
  CHECK(status_of(exchange(t.port(), "GET /health HTTP/1.1\r\nHost: a b\r\n\r\n")) == 400);
  CHECK(status_of(exchange(t.port(), "GET /health HTTP/1.0\r\n\r\n")) == 200);
  CHECK(status_of(exchange(t.port(), "GET /health HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\n\r\n")) == 200);
}

TEST_CASE("Expect: 100-continue") {
  TestServer t(echo_router());  // body_limit 4096
  SUBCASE("100 Continue before the body is read") {
    RawSocket socket(t.port());
    REQUIRE(socket.send_all("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n"
                            "Connection: close\r\n\r\n"));
    REQUIRE(socket.poll_input(2000ms) == 1);
    std::string interim(25, '\0');
    REQUIRE(::recv(socket.fd(), interim.data(), interim.size(), MSG_WAITALL) == 25);
    CHECK(interim == "HTTP/1.1 100 Continue\r\n\r\n");
    REQUIRE(socket.send_all("hello"));
    std::string out = socket.read_until_close();
    CHECK(status_of(out) == 200);
    CHECK(out.find("body=hello ") != std::string::npos);
  }
  SUBCASE("a body over the limit: 413 at once, no 100") {
    RawSocket socket(t.port());
    REQUIRE(socket.send_all("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n"));
    std::string out = socket.read_until_close();
    CHECK(status_of(out) == 413);
    CHECK(out.find("100 Continue") == std::string::npos);
  }
  SUBCASE("a head that fails a check: 400, no 100") {
    std::string out = exchange(t.port(), "POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    CHECK(status_of(out) == 400);
    CHECK(out.find("100 Continue") == std::string::npos);
  }
}

TEST_CASE("HttpClient: a hostile server's response is bounded, and throws instead of crashing") {
  asio::io_context ioc;
  auto fetch = [](uint16_t port, HttpClientConfig config) -> asio::awaitable<Response> {
    HttpClient client(co_await asio::this_coro::executor, config);
    co_await client.connect("127.0.0.1", port);
    Request request{"GET", "/", {}, {}};
    co_return co_await client.request(request);
  };
  auto outcome = [&](const std::string& response, HttpClientConfig config, size_t piece = 1 << 20) -> std::string {
    RawServer server(response, piece, piece < 1000 ? 1ms : 0ms);
    try {
      Response r = run_sync(fetch(server.port(), config));
      return "status " + std::to_string(r.status) + " body " + r.body;
    } catch (const boost::system::system_error& e) {
      return std::string("error ") + e.code().category().name();
    }
  };
  HttpClientConfig config;
  config.header_limit = 2048;
  std::string chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  CHECK(outcome(chunked + "2\r\nok\r\n0\r\n\r\n", config) == "status 200 body ok");
  CHECK(outcome("HTTP/1.1 100 Continue\r\n\r\n" + chunked + "2\r\nok\r\n0\r\n\r\n", config) == "status 200 body ok");
  std::string many_headers = "HTTP/1.1 200 OK\r\n";
  for (int i = 0; i < 200; ++i) many_headers += "X-" + std::to_string(i) + ": vvvvvvvvvvvvvvvv\r\n";
  CHECK(outcome(many_headers + "Content-Length: 0\r\n\r\n", config, 50) == "error kvfleet.http.parse");
  CHECK(outcome(chunked + "2\r\nok\r\n0\r\nX-Big: " + std::string(70'000, 't') + "\r\n\r\n", config) ==
        "error kvfleet.http.parse");
  CHECK(outcome(chunked + "2;" + std::string(10'000, 'e') + "\r\nok\r\n0\r\n\r\n", config, 500) ==
        "error kvfleet.http.parse");
  config.body_limit = 10;
  CHECK(outcome("HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + std::string(20, 'b'), config) == "error beast.http");
  CHECK(outcome("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto-eof", config) == "status 200 body to-eof");
}

TEST_CASE("SseParser: limits on a line and an event") {
  SseParser unlimited;
  CHECK(unlimited.feed("data: " + std::string(100'000, 'x') + "\n\n").size() == 1);
  SseParser lines(SseLimits{.max_line = 64});
  CHECK(lines.feed("data: short\n\n").size() == 1);
  CHECK_THROWS_AS(lines.feed("data: " + std::string(100, 'x')), SseLimitError);
  SseParser events(SseLimits{.max_line = 64, .max_event = 100});
  std::string many;
  for (int i = 0; i < 20; ++i) many += "data: 0123456789\n";
  CHECK_THROWS_AS(events.feed(many), SseLimitError);
}
