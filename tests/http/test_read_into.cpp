// HttpClient::read_some_into on a chunked body, which the client decodes itself so that chunk data goes
// from the socket straight into the caller's memory (KV transfer's pulls): the same bytes for any split of
// the response and any buffer size, a connection reusable after it, and hostile chunk framing bounded
// and refused as read_some refuses it.
#include <doctest/doctest.h>

#include "http_test_util.h"
#include "kvfleet/http/client.h"

using namespace kvfleet::http;
using namespace kvfleet::http::test;
namespace asio = boost::asio;

namespace {

asio::awaitable<std::string> read_into(uint16_t port, size_t out_size, bool* reusable) {
  HttpClientConfig config;
  config.piece_size = 1 << 20;  // as a pull's
  HttpClient client(co_await asio::this_coro::executor, config);
  co_await client.connect("127.0.0.1", port);
  Request request{"GET", "/", {}, {}};  // named: see test_server.cpp
  co_await client.send(request);
  const ResponseHead head = co_await client.read_head();
  std::string body = "status " + std::to_string(head.status) + " body ";
  std::vector<char> buf(out_size);
  for (;;) {
    const size_t n = co_await client.read_some_into(std::span<char>(buf));
    if (n == 0) break;
    body.append(buf.data(), n);
  }
  *reusable = client.reusable();
  co_return body;
}

std::string outcome(const std::string& response, size_t piece, size_t out_size, bool* reusable) {
  RawServer server(response, piece);
  try {
    return run_sync(read_into(server.port(), out_size, reusable));
  } catch (const boost::system::system_error& e) {
    return std::string("error ") + e.code().category().name();
  }
}

const std::string kChunkedHead = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

}  // namespace

TEST_CASE("read_some_into: a chunked body arrives whole for any split and buffer, then the connection is reusable") {
  std::string expected, response = kChunkedHead;
  int seed = 0;
  for (const size_t size : {1, 15, 16, 300, 4096, 70'000}) {
    std::string data(size, '\0');
    for (char& c : data) c = static_cast<char>('a' + (seed++ % 26));
    char line[32];
    std::snprintf(line, sizeof line, size == 300 ? "%zX;name=value\r\n" : "%zx\r\n", size);
    response += line + data + "\r\n";
    expected += data;
  }
  response += "0\r\nX-Trailer: 1\r\n\r\n";
  for (const size_t piece : {size_t{1}, size_t{7}, size_t{1000}, size_t{1} << 20})
    for (const size_t out : {size_t{1}, size_t{5}, size_t{4096}, size_t{1} << 20}) {
      if (piece == 1 && out > 1) continue;  // (byte by byte once is enough)
      CAPTURE(piece);
      CAPTURE(out);
      bool reusable = false;
      CHECK(outcome(response, piece, out, &reusable) == "status 200 body " + expected);
      CHECK(reusable);
    }
  bool reusable = false;  // no trailer fields
  CHECK(outcome(kChunkedHead + "2\r\nok\r\n0\r\n\r\n", 3, 64, &reusable) == "status 200 body ok");
  CHECK(reusable);
}

TEST_CASE("read_some_into: hostile chunk framing throws, bounded") {
  bool reusable = false;
  const std::string parse = "error kvfleet.http.parse", beast = "error beast.http";
  CHECK(outcome(kChunkedHead + "2;" + std::string(10'000, 'e') + "\r\nok\r\n0\r\n\r\n", 500, 64, &reusable) == parse);
  CHECK(outcome(kChunkedHead + std::string(10'000, '0') + "2\r\nok\r\n0\r\n\r\n", 500, 64, &reusable) == parse);  // a line over its bound
  CHECK(outcome(kChunkedHead + "2\r\nok\r\n0\r\nX-Big: " + std::string(70'000, 't') + "\r\n\r\n", 1 << 20, 64, &reusable) ==
        parse);
  CHECK(outcome(kChunkedHead + "zz\r\nok\r\n0\r\n\r\n", 1 << 20, 64, &reusable) == beast);
  CHECK(outcome(kChunkedHead + "2\r\nokXX0\r\n\r\n", 1 << 20, 64, &reusable) == beast);           // no CRLF after data
  CHECK(outcome(kChunkedHead + "10\r\nabc", 1 << 20, 64, &reusable) == beast);                    // ends inside a chunk
  CHECK(outcome(kChunkedHead + "2\r\nok\r\n", 1 << 20, 64, &reusable) == beast);                  // no last chunk
  CHECK(outcome(kChunkedHead + "fffffffffffffffff\r\n", 1 << 20, 64, &reusable) == beast);        // over 2^60
}
