// Request/response behaviour of HttpServer: routing, keep-alive, limits and deadlines.
#include <doctest/doctest.h>

#include "http_test_util.h"
#include "kvfleet/http/client.h"
#include "kvfleet/http/json_error.h"

using namespace kvfleet::http;
using namespace kvfleet::http::test;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

HttpRouter echo_router() {
  HttpRouter router;
  router.post("/echo", [](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
    Response response = Response::text(200, request.method + " " + request.target + " " + request.body);
    if (const std::string* tag = request.headers.find("x-tag")) response.headers.set("x-tag", *tag);
    co_await writer.send(std::move(response));
  });
  router.get("/health", [](const Request&, ResponseWriter& writer) -> asio::awaitable<void> {
    co_await writer.send(Response::json(200, R"({"status":"ok"})"));
  });
  router.get("/throws", [](const Request&, ResponseWriter&) -> asio::awaitable<void> {
    throw std::runtime_error("handler failed");
    co_return;
  });
  return router;
}

}  // namespace

TEST_CASE("echo round trip") {
  TestServer t(echo_router());
  CHECK(t.port() != 0);
  Response r = http_request("127.0.0.1", t.port(), "POST", "/echo?q=1", "hello", {{"X-Tag", "t1"}});
  CHECK(r.status == 200);
  CHECK(r.body == "POST /echo?q=1 hello");
  CHECK(*r.headers.find("x-tag") == "t1");
  CHECK(*r.headers.find("content-length") == "20");
}

TEST_CASE("keep-alive: two requests on one connection") {
  TestServer t(echo_router());
  auto two_requests = [&]() -> asio::awaitable<std::pair<std::string, std::string>> {
    auto executor = co_await asio::this_coro::executor;
    HttpClient client(executor);
    co_await client.connect("127.0.0.1", t.port());
    // Named, not braced temporaries: GCC 12 destroys those twice inside a co_await expression.
    Request one{"POST", "/echo", {}, "one"};
    Request two{"POST", "/echo", {}, "two"};
    Response first = co_await client.request(one);
    Response second = co_await client.request(two);
    CHECK(t.server.connection_count() == 1);
    co_return std::pair{first.body, second.body};
  };
  auto [first, second] = run_sync(two_requests());
  CHECK(first == "POST /echo one");
  CHECK(second == "POST /echo two");
}

TEST_CASE("pipelined requests are answered in order") {
  TestServer t(echo_router());
  RawSocket socket(t.port());
  std::string request_a = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na";
  std::string request_b = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nb";
  REQUIRE(socket.send_all(request_a + request_b));
  std::string out = socket.read_until_close();
  size_t a = out.find("POST /echo a");
  size_t b = out.find("POST /echo b");
  CHECK(a != std::string::npos);
  CHECK(b != std::string::npos);
  CHECK(a < b);
}

TEST_CASE("unknown path is 404, wrong method is 405, both with JSON error bodies") {
  TestServer t(echo_router());
  Response missing = http_request("127.0.0.1", t.port(), "GET", "/nope");
  CHECK(missing.status == 404);
  CHECK(error_of(missing.body).at("type") == "not_found_error");
  CHECK(error_of(missing.body).at("message") == "no route for /nope");
  Response wrong = http_request("127.0.0.1", t.port(), "GET", "/echo");
  CHECK(wrong.status == 405);
  CHECK(*wrong.headers.find("allow") == "POST");
  CHECK(error_of(wrong.body).at("type") == "method_not_allowed");
}

TEST_CASE("prefix routes: exact paths win, then the longest prefix; the bare prefix and other methods are not it") {
  HttpRouter router = echo_router();
  const auto named = [](std::string name) {
    return [name](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
      co_await writer.send(Response::text(200, name + " " + std::string(request.path())));
    };
  };
  router.add_prefix("GET", "/items/", named("item"));
  router.add_prefix("DELETE", "/items/", named("delete"));
  router.add_prefix("GET", "/items/special/", named("special"));
  router.get("/items/exact", named("exact"));
  TestServer t(std::move(router));
  CHECK(http_request("127.0.0.1", t.port(), "GET", "/items/a1").body == "item /items/a1");
  CHECK(http_request("127.0.0.1", t.port(), "GET", "/items/a1?x=1").body == "item /items/a1");
  CHECK(http_request("127.0.0.1", t.port(), "DELETE", "/items/a1").body == "delete /items/a1");
  CHECK(http_request("127.0.0.1", t.port(), "GET", "/items/special/b").body == "special /items/special/b");
  CHECK(http_request("127.0.0.1", t.port(), "GET", "/items/exact").body == "exact /items/exact");
  CHECK(http_request("127.0.0.1", t.port(), "GET", "/items/").status == 404);
  const Response wrong = http_request("127.0.0.1", t.port(), "POST", "/items/a1");
  CHECK(wrong.status == 405);
  CHECK(*wrong.headers.find("allow") == "DELETE, GET");
}

TEST_CASE("a handler exception becomes a 500 JSON error") {
  TestServer t(echo_router());
  Response r = http_request("127.0.0.1", t.port(), "GET", "/throws");
  CHECK(r.status == 500);
  CHECK(error_of(r.body).at("message") == "handler failed");
  CHECK(error_of(r.body).at("type") == "server_error");
}

TEST_CASE("body over the limit is 413") {
  TestServer t(echo_router());  // body_limit 4096
  Response fits = http_request("127.0.0.1", t.port(), "POST", "/echo", std::string(4096, 'x'));
  CHECK(fits.status == 200);
  Response big = http_request("127.0.0.1", t.port(), "POST", "/echo", std::string(4097, 'x'));
  CHECK(big.status == 413);
  CHECK(error_of(big.body).at("type") == "request_too_large");
  CHECK(*big.headers.find("connection") == "close");
}

TEST_CASE("chunked body over the limit is 413") {
  TestServer t(echo_router());
  RawSocket socket(t.port());
  std::string request = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 5; ++i) request += "400\r\n" + std::string(1024, 'y') + "\r\n";  // 5 KiB
  request += "0\r\n\r\n";
  socket.send_all(request);
  std::string out = socket.read_until_close();
  CHECK(out.starts_with("HTTP/1.1 413 "));
}

TEST_CASE("headers over the limit are 431") {
  TestServer t(echo_router());  // header_limit 2048
  Response big = http_request("127.0.0.1", t.port(), "GET", "/health", {}, {{"X-Big", std::string(3000, 'h')}});
  CHECK(big.status == 431);
  CHECK(error_of(big.body).at("type") == "request_too_large");
  Response fine = http_request("127.0.0.1", t.port(), "GET", "/health", {}, {{"X-Big", std::string(1500, 'h')}});
  CHECK(fine.status == 200);
}

TEST_CASE("malformed request is 400") {
  TestServer t(echo_router());
  RawSocket socket(t.port());
  socket.send_all("GET /health HTTP/1.1\r\nBad Header Without Colon\r\n\r\n");
  CHECK(socket.read_until_close().starts_with("HTTP/1.1 400 "));
}

TEST_CASE("a client that sends its headers byte by byte is cut off at the read deadline with 408") {
  HttpServerConfig config = small_config();
  config.read_timeout = 300ms;
  TestServer t(echo_router(), config);
  RawSocket socket(t.port());
  std::string request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: aaaaaaaaaaaaaaaa\r\n\r\n";
  auto start = std::chrono::steady_clock::now();
  size_t sent = 0;
  int input = -1;
  while (sent < request.size() && input == -1) {
    if (!socket.send_all(request.substr(sent, 1))) break;
    ++sent;
    input = socket.poll_input(40ms);  // one byte every 40 ms: the whole head would take ~2.7 s
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  std::string out = socket.read_until_close();
  CHECK(out.starts_with("HTTP/1.1 408 "));  // the request had begun: answered, then closed
  CHECK(out.find("Connection: close") != std::string::npos);
  CHECK(error_of(out.substr(out.find("\r\n\r\n") + 4)).at("type") == "request_timeout");
  CHECK(sent < request.size());
  CHECK(elapsed >= 280ms);
  CHECK(elapsed < 1500ms);
  // The server is still fine for others.
  CHECK(http_request("127.0.0.1", t.port(), "GET", "/health").status == 200);
}

TEST_CASE("an idle keep-alive connection is closed at the read deadline") {
  HttpServerConfig config = small_config();
  config.read_timeout = 200ms;
  TestServer t(echo_router(), config);
  RawSocket socket(t.port());
  auto start = std::chrono::steady_clock::now();
  CHECK(socket.poll_input(2000ms) == 0);
  CHECK(std::chrono::steady_clock::now() - start < 1000ms);
}
