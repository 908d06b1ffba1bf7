// libFuzzer target: the HTTP request path of HttpServer, shared by the router and the replica.
//
// Input: byte 0 picks a piece size (1..64), the rest are the bytes a client sends. Each input runs
//  1. the parser the session uses (BoundedParser + check_request_head) directly, fed in pieces of
//     that size as a trickling client would, checking our limits as invariants (a head accepted is
//     never over header_limit, a body never over body_limit); then
//  2. a real HttpServer session: the bytes go over a loopback TCP connection to a server started
//     once per process (small limits, 200 ms deadlines, routes like the replica's: a JSON echo, an
//     SSE stream, a handler that throws), and the answer is read until the server closes, at most
//     ~2 s (a hang shows up as a libFuzzer timeout). A crash, sanitizer report or abort is a finding.
//
// Build by hand with clang 14. Two flags matter: -fno-sanitize=function and no -g. With coroutines,
// coverage instrumentation and UBSan together, clang 14 fails with "Cannot represent a difference
// across sections" under -fsanitize=function, and under -g in client.cpp and session.cpp:
//   clang++ -std=c++20 -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize=function -I. \
//     -Iengine/include fuzz/http_request.cpp engine/core/http/{client,json_error,message,\
//     request_checks,router,server,session,session_read,sse}.cpp -lboost_json -lpthread \
//     -o build/fuzz_http_request
// It needs only those files of kvfleet_core (no prometheus, tokenizer or engine), Boost.Asio/Beast
// (headers) and Boost.JSON (json_error.cpp).
// Run: build/fuzz_http_request fuzz/corpus/http_request -max_total_time=60 -timeout=10
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "engine/core/http/bounded_parser.h"
#include "engine/core/http/request_checks.h"
#include "kvfleet/http/json_error.h"
#include "kvfleet/http/server.h"
#include "kvfleet/http/sse.h"

namespace {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using namespace kvfleet::http;
using namespace std::chrono_literals;

HttpServerConfig fuzz_config() {
  HttpServerConfig config;
  config.io_threads = 2;
  config.header_timeout = 200ms;
  config.body_timeout = 200ms;
  config.idle_timeout = 100ms;
  config.write_timeout = 500ms;
  config.header_limit = 1024;
  config.trailer_limit = 256;
  config.chunk_extension_limit = 128;
  config.body_limit = 4096;
  config.max_connections = 64;
  return config;
}

// 1. The parser alone, fed `piece` bytes at a time.
void parse_in_pieces(std::string_view input, size_t piece) {
  const HttpServerConfig config = fuzz_config();
  BoundedParser<bhttp::request_parser<bhttp::string_body>> reader(
      ParseLimits{config.header_limit, config.trailer_limit, config.chunk_extension_limit});
  auto& parser = reader.start(config.body_limit);
  std::string buffer;
  size_t fed = 0, head_bytes = 0;
  bool checked = false;
  while (!parser.is_done()) {
    boost::system::error_code ec = bhttp::error::need_more;
    const bool in_head = !parser.is_header_done();
    size_t used = buffer.empty() ? 0 : reader.step(buffer, ec);
    if (in_head) head_bytes += used;
    buffer.erase(0, used);
    if (ec && ec != bhttp::error::need_more) return;  // refused: fine
    if (parser.is_header_done() && !checked) {
      checked = true;
      if (head_bytes > config.header_limit) std::abort();  // a head over the limit got through
      if (check_request_head(parser.get())) return;
    }
    if (!ec && used > 0 && !buffer.empty()) continue;
    if (fed >= input.size()) return;  // incomplete
    size_t n = std::min(piece, input.size() - fed);
    buffer.append(input.substr(fed, n));
    fed += n;
  }
  if (parser.get().body().size() > config.body_limit) std::abort();
}

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer timer(co_await asio::this_coro::executor, d);
  co_await timer.async_wait(asio::use_awaitable);
}

HttpRouter fuzz_routes() {
  HttpRouter router;
  router.post("/v1/completions", [](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
    co_await writer.send(Response::json(200, "{\"echo\":" + std::to_string(request.body.size()) + "}"));
  });
  router.get("/stream", [](const Request&, ResponseWriter& writer) -> asio::awaitable<void> {
    Headers headers{{"Content-Type", "text/event-stream"}};
    co_await writer.begin_stream(200, headers);
    for (int i = 0; i < 3 && !writer.client_gone(); ++i) {
      co_await sleep_for(5ms);
      co_await writer.write(sse_format(std::to_string(i)));
    }
    co_await writer.write(sse_format("[DONE]"));
    co_await writer.finish();
  });
  router.get("/throws", [](const Request&, ResponseWriter&) -> asio::awaitable<void> {
    throw std::runtime_error("handler failed");
    co_return;
  });
  router.get("/health", [](const Request&, ResponseWriter& writer) -> asio::awaitable<void> {
    co_await writer.send(Response::json(200, "{}"));
  });
  return router;
}

HttpServer& server() {
  static HttpServer* instance = [] {
    auto* s = new HttpServer(fuzz_config(), fuzz_routes());  // lives for the process
    s->start();
    return s;
  }();
  return *instance;
}

// 2. A real session over loopback.
void exchange(std::string_view input) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server().port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) std::abort();
  while (!input.empty()) {
    ssize_t n = ::send(fd, input.data(), input.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    input.remove_prefix(static_cast<size_t>(n));
  }
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  auto until = std::chrono::steady_clock::now() + 2s;
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 500) <= 0) continue;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) break;
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  size_t piece = 1 + data[0] % 64;
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  parse_in_pieces(input, piece);
  exchange(input);
  return 0;
}
