#include "kvfleet/http/client.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

#include "bounded_parser.h"

namespace kvfleet::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::ip::tcp;
using boost::system::error_code;
using boost::system::system_error;
constexpr auto tuple_awaitable = asio::as_tuple(asio::use_awaitable);

struct HttpClient::Impl {
  // The buffer gets room for a whole small response up front (Beast reads at most its free capacity).
  Impl(asio::any_io_executor executor, HttpClientConfig c)
      : config(std::move(c)),
        stream(std::move(executor)),
        reader(ParseLimits{config.header_limit, config.trailer_limit, config.chunk_extension_limit}),
        piece(config.piece_size) {
    buffer.reserve(std::max<size_t>(16 * 1024, config.piece_size));  // reads take at most the free capacity
  }

  std::string_view unread() const { return {static_cast<const char*>(buffer.data().data()), buffer.size()}; }

  // One parse step over what is buffered (see BoundedParser); need_more when nothing is.
  error_code step() {
    error_code ec = bhttp::error::need_more;
    if (buffer.size() == 0) return ec;
    size_t used = reader.step(unread(), ec);
    buffer.consume(used);
    if (!ec && used == 0) ec = bhttp::error::need_more;
    if (!ec && buffer.size() == 0 && !reader.parser().is_done()) ec = bhttp::error::need_more;
    return ec;
  }

  // Reads more of the response into `buffer`; false at the end of the stream.
  asio::awaitable<bool> read_more() {
    stream.expires_after(config.io_timeout);
    auto space = buffer.prepare(beast::read_size(buffer, std::max<size_t>(64 * 1024, config.piece_size)));
    auto [ec, n] = co_await stream.async_read_some(space, tuple_awaitable);
    buffer.commit(n);
    if (ec == asio::error::eof) co_return false;
    if (ec) fail(ec);
    co_return true;
  }

  // Closes the connection and throws: a half-read response leaves the stream unusable.
  [[noreturn]] void fail(error_code ec) {
    close();
    throw system_error(ec);
  }
  // The parser stays: a read may be pending (close() from a disconnect callback); it then fails
  // with operation_aborted (reads only fill `buffer`; the coroutine parses). A closed socket is
  // never reusable().
  void close() {
    error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
  }

  // read_some_into decodes a chunked body itself (Beast's parser would copy every byte out of `buffer`):
  // chunk data is read from the socket straight into the caller's memory (KV transfer's bulk bodies).
  struct Chunks {
    bool active = false;      // read_some_into took this body over (read_some had not begun it)
    bool done = false;        // the last chunk and the trailer section are read
    bool crlf = false;        // the CRLF that ends a chunk's data comes next
    bool trailer = false;     // after the last chunk "0": the trailer section comes next
    uint64_t left = 0;        // data bytes of the current chunk still to come
    size_t extension_bytes = 0;
  };
  // One step over what `buffer` holds when no chunk data is due: need_more when a line is incomplete.
  error_code chunk_step() {
    const std::string_view u = unread();
    if (chunks.crlf) {
      if (u.size() < 2) return bhttp::error::need_more;
      if (!u.starts_with("\r\n")) return bhttp::error::bad_chunk;
      buffer.consume(2);
      chunks.crlf = false;
      return {};
    }
    if (chunks.trailer) {  // fields are discarded; only their size is bounded
      const size_t end = u.starts_with("\r\n") ? 0 : u.substr(0, config.trailer_limit + 4).find("\r\n\r\n");
      if (end == std::string_view::npos && u.size() <= config.trailer_limit + 4) return bhttp::error::need_more;
      if (end == std::string_view::npos || end > config.trailer_limit) return ParseError::trailer_too_large;
      buffer.consume(end == 0 ? 2 : end + 4);
      chunks.done = true;
      return {};
    }
    const size_t line_allowance = config.chunk_extension_limit + 64, eol = u.substr(0, line_allowance + 2).find("\r\n");
    if (eol == std::string_view::npos || eol > line_allowance)
      return u.size() > line_allowance ? error_code(ParseError::chunk_line_too_long) : error_code(bhttp::error::need_more);
    uint64_t size = 0;
    size_t digits = 0;
    for (; digits < eol && std::isxdigit(static_cast<unsigned char>(u[digits])); ++digits) {
      if (digits == 15) return bhttp::error::bad_chunk;  // over 2^60 bytes
      const char c = u[digits];
      size = size * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    const std::string_view rest = u.substr(digits, eol - digits);
    if (digits == 0 || (!rest.empty() && rest[0] != ';' && rest[0] != ' ' && rest[0] != '\t')) return bhttp::error::bad_chunk;
    chunks.extension_bytes += rest.size();
    if (chunks.extension_bytes > config.chunk_extension_limit) return ParseError::chunk_extensions_too_long;
    buffer.consume(eol + 2);
    chunks.left = size;
    chunks.trailer = size == 0;
    return {};
  }
  // Body bytes of a chunked body read_some_into took over: buffered ones first, then straight from the socket.
  asio::awaitable<size_t> read_chunked_into(std::span<char> out) {
    while (!chunks.done) {
      if (chunks.left == 0) {
        const error_code ec = chunk_step();
        if (ec && ec != bhttp::error::need_more) fail(ec);
        if (!ec) continue;
        stream.expires_after(config.io_timeout);  // a small read: the data after the line goes to `out` next
        auto [read_ec, n] = co_await stream.async_read_some(buffer.prepare(1024), tuple_awaitable);
        buffer.commit(n);
        if (read_ec) fail(read_ec == asio::error::eof ? error_code(bhttp::error::partial_message) : read_ec);
        continue;
      }
      const size_t want = static_cast<size_t>(std::min<uint64_t>(chunks.left, out.size()));
      size_t n = std::min(want, buffer.size());
      if (n > 0) {
        std::memcpy(out.data(), buffer.data().data(), n);
        buffer.consume(n);
      } else {
        stream.expires_after(config.io_timeout);
        auto [ec, got] = co_await stream.async_read_some(asio::buffer(out.data(), want), tuple_awaitable);
        if (ec) fail(ec == asio::error::eof ? error_code(bhttp::error::partial_message) : ec);
        n = got;
      }
      chunks.left -= n;
      chunks.crlf = chunks.left == 0;
      co_return n;
    }
    co_return 0;
  }

  // read_chunked_into over several buffers in turn (one readv): the bytes of the current chunk, at most
  // the buffers' total, fill them in order; returns how many.
  asio::awaitable<size_t> read_chunked_scattered(std::span<const std::span<char>> outs) {
    size_t total = 0;
    for (const auto& o : outs) total += o.size();
    if (chunks.done || total == 0) co_return 0;
    if (chunks.left == 0 || buffer.size() > 0) {  // a chunk line, or buffered bytes: the first buffer alone
      for (const auto& o : outs)
        if (!o.empty()) {
          const size_t n = co_await read_chunked_into(o);  // (named: GCC 12)
          co_return n;
        }
    }
    std::vector<asio::mutable_buffer> bufs;
    uint64_t room = std::min<uint64_t>(chunks.left, total);
    for (const auto& o : outs) {
      if (room == 0) break;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(room, o.size()));
      if (take > 0) bufs.emplace_back(o.data(), take);
      room -= take;
    }
    stream.expires_after(config.io_timeout);
    auto [ec, got] = co_await stream.async_read_some(bufs, tuple_awaitable);
    if (ec) fail(ec == asio::error::eof ? error_code(bhttp::error::partial_message) : ec);
    chunks.left -= got;
    chunks.crlf = chunks.left == 0;
    co_return got;
  }

  HttpClientConfig config;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  BoundedParser<bhttp::response_parser<bhttp::buffer_body>> reader;
  std::vector<char> piece;
  std::string host_header;
  bool head_request = false;  // a HEAD response has no body whatever its headers say
  bool beast_body = false;    // read_some began this body: Beast's parser reads it to the end
  Chunks chunks;
};

HttpClient::HttpClient(asio::any_io_executor executor) : HttpClient(std::move(executor), HttpClientConfig()) {}

HttpClient::HttpClient(asio::any_io_executor executor, HttpClientConfig config)
    : impl_(std::make_unique<Impl>(std::move(executor), std::move(config))) {}

HttpClient::~HttpClient() = default;

asio::awaitable<void> HttpClient::connect(std::string host, uint16_t port) {
  Impl& s = *impl_;
  error_code ec;
  asio::ip::address address = asio::ip::make_address(host, ec);
  std::vector<tcp::endpoint> endpoints;
  if (!ec) {
    endpoints.emplace_back(address, port);
  } else {
    tcp::resolver resolver(s.stream.get_executor());
    auto [resolve_ec, results] = co_await resolver.async_resolve(host, std::to_string(port), tuple_awaitable);
    if (resolve_ec) throw system_error(resolve_ec, "resolve " + host);
    for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  }
  s.stream.expires_after(s.config.connect_timeout);
  auto [connect_ec, endpoint] = co_await s.stream.async_connect(endpoints, tuple_awaitable);
  if (connect_ec) s.fail(connect_ec);
  s.stream.socket().set_option(tcp::no_delay(true), ec);
  s.host_header = host + ":" + std::to_string(port);
  s.buffer.clear();
}

asio::awaitable<void> HttpClient::send(const Request& request) {
  Impl& s = *impl_;
  bhttp::request<bhttp::string_body> message;
  message.method_string(request.method);
  message.target(request.target);
  message.version(11);
  for (const Headers::Field& f : request.headers.fields()) message.insert(f.name, f.value);
  if (message.find(bhttp::field::host) == message.end()) message.set(bhttp::field::host, s.host_header);
  message.body() = request.body;
  message.prepare_payload();
  s.head_request = request.method == "HEAD";
  s.stream.expires_after(s.config.io_timeout);
  auto [ec, n] = co_await bhttp::async_write(s.stream, message, tuple_awaitable);
  if (ec) s.fail(ec);
}

// The head and the body are read through BoundedParser: Beast's own read operations would run its
// parser inside a completion handler, where a hostile server's 64 KiB trailer field throws out of
// io_context::run(), and they bound neither a head spread over many reads nor chunk extensions.
asio::awaitable<ResponseHead> HttpClient::read_head() {
  Impl& s = *impl_;
  auto* parser = &s.reader.start(std::nullopt);  // read_body() applies body_limit; read_some() none
  s.beast_body = false;
  s.chunks = {};
  if (s.head_request) parser->skip(true);
  for (;;) {
    error_code ec = s.step();
    if (ec && ec != bhttp::error::need_more) s.fail(ec);
    // An interim 1xx (e.g. 100 Continue when the request had Expect) precedes the response: skip it.
    const int status = parser->is_header_done() ? static_cast<int>(parser->get().result_int()) : 0;
    if (status >= 100 && status < 200 && status != 101) {
      parser = &s.reader.start(std::nullopt);
      if (s.head_request) parser->skip(true);
      continue;
    }
    if (parser->is_header_done()) break;
    if (!ec) continue;
    bool more = co_await s.read_more();  // (not inside &&: GCC 12 miscompiles co_await there)
    if (!more) s.fail(parser->got_some() ? bhttp::error::partial_message : bhttp::error::end_of_stream);
  }
  const auto& message = parser->get();
  ResponseHead head;
  head.status = static_cast<int>(message.result_int());
  for (const auto& field : message) head.headers.add(field.name_string(), field.value());
  head.chunked = message.chunked();
  if (auto length = parser->content_length()) head.content_length = *length;
  head.keep_alive = message.keep_alive();
  co_return head;
}

asio::awaitable<std::optional<std::string>> HttpClient::read_some() {
  Impl& s = *impl_;
  if (!s.reader.active()) throw std::logic_error("HttpClient::read_some before read_head");
  if (s.chunks.active) throw std::logic_error("HttpClient::read_some after read_some_into took the body over");
  s.beast_body = true;
  auto& parser = s.reader.parser();
  while (!parser.is_done()) {
    auto& body = parser.get().body();
    body.data = s.piece.data();
    body.size = s.piece.size();
    error_code ec = s.step();
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec && ec != bhttp::error::need_more) s.fail(ec);
    size_t got = s.piece.size() - body.size;
    // Some steps only consume chunk framing; keep going until body bytes appear.
    if (got > 0) co_return std::string(s.piece.data(), got);
    if (!ec || parser.is_done()) continue;
    bool more = co_await s.read_more();
    if (!more) {
      if (!parser.need_eof()) s.fail(bhttp::error::partial_message);
      parser.put_eof(ec);  // a body that ends with the connection
      if (ec) s.fail(ec);
    }
  }
  co_return std::nullopt;
}

// read_some's loop with the caller's memory as the body buffer (the parser copies straight into it).
asio::awaitable<size_t> HttpClient::read_some_into(std::span<char> out) {
  Impl& s = *impl_;
  if (!s.reader.active()) throw std::logic_error("HttpClient::read_some_into before read_head");
  if (out.empty()) throw std::invalid_argument("HttpClient::read_some_into an empty buffer");
  auto& parser = s.reader.parser();
  if (!s.beast_body && parser.is_header_done() && !parser.is_done() && parser.chunked()) s.chunks.active = true;
  if (s.chunks.active) {
    const size_t n = co_await s.read_chunked_into(out);  // (named: GCC 12)
    co_return n;
  }
  while (!parser.is_done()) {
    auto& body = parser.get().body();
    body.data = out.data();
    body.size = out.size();
    error_code ec = s.step();
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec && ec != bhttp::error::need_more) s.fail(ec);
    size_t got = out.size() - body.size;
    // Some steps only consume chunk framing; keep going until body bytes appear.
    if (got > 0) co_return got;
    if (!ec || parser.is_done()) continue;
    bool more = co_await s.read_more();
    if (!more) {
      if (!parser.need_eof()) s.fail(bhttp::error::partial_message);
      parser.put_eof(ec);  // a body that ends with the connection
      if (ec) s.fail(ec);
    }
  }
  co_return 0;
}

asio::awaitable<size_t> HttpClient::read_some_scattered(std::span<const std::span<char>> outs) {
  Impl& s = *impl_;
  if (!s.reader.active()) throw std::logic_error("HttpClient::read_some_scattered before read_head");
  auto& parser = s.reader.parser();
  if (!s.beast_body && parser.is_header_done() && !parser.is_done() && parser.chunked()) s.chunks.active = true;
  if (s.chunks.active) {
    const size_t n = co_await s.read_chunked_scattered(outs);  // (named: GCC 12)
    co_return n;
  }
  for (const auto& o : outs)  // not a chunked body: the first non-empty buffer, as read_some_into does
    if (!o.empty()) {
      const size_t n = co_await read_some_into(o);
      co_return n;
    }
  throw std::invalid_argument("HttpClient::read_some_scattered into empty buffers");
}

asio::awaitable<std::string> HttpClient::read_body() {
  std::string body;
  while (std::optional<std::string> piece = co_await read_some()) {
    if (body.size() + piece->size() > impl_->config.body_limit) impl_->fail(bhttp::error::body_limit);
    body += *piece;
  }
  co_return body;
}

asio::awaitable<Response> HttpClient::request(const Request& request) {
  co_await send(request);
  ResponseHead head = co_await read_head();
  Response response;
  response.status = head.status;
  response.headers = std::move(head.headers);
  response.body = co_await read_body();
  co_return response;
}

void HttpClient::close() { impl_->close(); }

bool HttpClient::is_open() const { return impl_->stream.socket().is_open(); }

bool HttpClient::reusable() const {
  const Impl& s = *impl_;
  const bool body_read = s.reader.active() && (s.chunks.active ? s.chunks.done : s.reader.parser().is_done());
  return s.stream.socket().is_open() && body_read && s.reader.parser().get().keep_alive() && s.buffer.size() == 0;
}

asio::any_io_executor HttpClient::executor() const { return impl_->stream.get_executor(); }


namespace {

asio::awaitable<Response> one_request(HttpClient& client, const std::string& host, uint16_t port,
                                      const Request& request) {
  co_await client.connect(host, port);
  co_return co_await client.request(request);
}

}  // namespace

Response http_request(const std::string& host, uint16_t port, std::string method, std::string target,
                      std::string body, Headers headers, std::chrono::milliseconds timeout) {
  asio::io_context ioc;
  HttpClient client(ioc.get_executor(), HttpClientConfig{.connect_timeout = timeout, .io_timeout = timeout});
  Request request{std::move(method), std::move(target), std::move(headers), std::move(body)};
  std::exception_ptr error;
  Response response;
  asio::co_spawn(ioc, one_request(client, host, port, request), [&](std::exception_ptr e, Response r) {
    error = e;
    response = std::move(r);
  });
  ioc.run();
  if (error) std::rethrow_exception(error);
  return response;
}

}  // namespace kvfleet::http
