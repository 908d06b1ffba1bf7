#include "session.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>

#include <sys/socket.h>

#include <cerrno>

#include "kvfleet/http/json_error.h"

namespace kvfleet::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::use_awaitable;
using boost::system::error_code;
constexpr auto tuple_awaitable = asio::as_tuple(use_awaitable);

namespace {

Request to_request(bhttp::request<bhttp::string_body>&& message) {
  Request request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  for (const auto& field : message) {
    request.headers.add(field.name_string(), field.value());
  }
  request.body = std::move(message.body());
  return request;
}

template <typename Message>
void copy_headers(const Headers& from, Message& to) {
  for (const Headers::Field& f : from.fields()) to.insert(f.name, f.value);
}

// The status to answer a failed request read with; 0: just close (the peer closed or reset, the
// read timed out and tcp_stream already closed the socket, or the server is stopping).
int read_error_status(error_code ec) {
  if (ec == bhttp::error::header_limit) return 431;
  if (ec == bhttp::error::body_limit) return 413;
  if (ec == bhttp::error::end_of_stream || ec == beast::error::timeout ||
      ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
      ec == asio::error::eof || ec == asio::error::bad_descriptor) {
    return 0;
  }
  return 400;
}

}  // namespace

// The ResponseWriter of one request; lives on the stack of Session::serve.
class SessionWriter final : public ResponseWriter {
 public:
  SessionWriter(Session& session, bool keep_alive) : session_(session), keep_alive_(keep_alive) {}

  asio::awaitable<bool> send(Response response) override {
    if (started_) throw std::logic_error("ResponseWriter::send after the response started");
    started_ = finished_ = true;
    bhttp::response<bhttp::string_body> message{bhttp::status(response.status), 11};
    copy_headers(response.headers, message);
    message.body() = std::move(response.body);
    message.keep_alive(keep_alive());
    message.prepare_payload();
    session_.stream_.expires_after(session_.server_.config.write_timeout);
    auto [ec, n] = co_await bhttp::async_write(session_.stream_, message, tuple_awaitable);
    co_return check(ec);
  }

  asio::awaitable<bool> begin_stream(int status, Headers headers) override {
    if (started_) throw std::logic_error("ResponseWriter::begin_stream after the response started");
    started_ = streaming_ = true;
    bhttp::response<bhttp::empty_body> message{bhttp::status(status), 11};
    copy_headers(headers, message);
    message.keep_alive(keep_alive());
    message.chunked(true);
    bhttp::response_serializer<bhttp::empty_body> serializer{message};
    session_.stream_.expires_after(session_.server_.config.write_timeout);
    auto [ec, n] = co_await bhttp::async_write_header(session_.stream_, serializer, tuple_awaitable);
    co_return check(ec);
  }

  asio::awaitable<bool> write(std::string_view piece) override {
    if (!streaming_ || finished_) throw std::logic_error("ResponseWriter::write outside a stream");
    if (session_.client_gone_) co_return false;
    if (piece.empty()) co_return true;  // an empty chunk would end the stream
    session_.stream_.expires_after(session_.server_.config.write_timeout);
    auto [ec, n] = co_await asio::async_write(
        session_.stream_, bhttp::make_chunk(asio::buffer(piece.data(), piece.size())), tuple_awaitable);
    co_return check(ec);
  }

  asio::awaitable<bool> finish() override {
    if (!streaming_) throw std::logic_error("ResponseWriter::finish without begin_stream");
    if (finished_) co_return !session_.client_gone_;
    finished_ = true;
    if (session_.client_gone_) co_return false;
    session_.stream_.expires_after(session_.server_.config.write_timeout);
    auto [ec, n] = co_await asio::async_write(session_.stream_, bhttp::make_chunk_last(), tuple_awaitable);
    co_return check(ec);
  }

  bool client_gone() const override { return session_.client_gone_; }

  void on_disconnect(std::function<void()> callback) override {
    if (session_.client_gone_) {
      callback();
    } else {
      session_.on_disconnect_ = std::move(callback);
    }
  }

  bool started() const override { return started_; }
  bool streaming() const { return streaming_; }
  bool finished() const { return finished_; }
  bool keep_alive() const { return keep_alive_ && !session_.server_.stopping; }

 private:
  bool check(error_code ec) {
    if (ec) session_.mark_gone();
    return !ec;
  }

  Session& session_;
  bool keep_alive_;
  bool started_ = false;
  bool streaming_ = false;
  bool finished_ = false;
};

// Beast reads at most the buffer's free capacity (at least 512 bytes) per call, and an empty buffer
// never grows: a 6 kB chat request took 13 recvmsg calls. Room for a typical request in one.
Session::Session(HttpServer::State& server, asio::ip::tcp::socket socket)
    : server_(server), stream_(std::move(socket)) {
  buffer_.reserve(16 * 1024);
}

Session::~Session() { server_.remove_session(this); }

asio::awaitable<void> Session::run() {
  auto self = shared_from_this();  // the connection lives while its coroutine does
  const HttpServerConfig& config = server_.config;
  for (;;) {
    if (server_.stopping) break;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(std::min<size_t>(config.header_limit, UINT32_MAX)));
    parser_->body_limit(config.body_limit);
    stream_.expires_after(config.read_timeout);
    reading_ = true;
    auto [ec, n] = co_await bhttp::async_read(stream_, buffer_, *parser_, tuple_awaitable);
    reading_ = false;
    if (ec) {
      // Classified here, before the coroutine call (an error_code argument crashed GCC 12 code).
      if (int status = read_error_status(ec)) co_await answer_read_error(status, ec.message());
      stream_.close();
      co_return;
    }
    bool keep_alive = parser_->get().keep_alive();
    Request request = to_request(parser_->release());
    parser_.reset();
    if (!co_await serve(request, keep_alive) || !keep_alive) break;
  }
  error_code ignored;
  stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  stream_.close();
}

asio::awaitable<bool> Session::serve(const Request& request, bool keep_alive) {
  client_gone_ = false;
  on_disconnect_ = nullptr;
  uint64_t generation = ++watch_generation_;
  asio::co_spawn(executor(), watch_disconnect(generation), asio::detached);

  SessionWriter writer(*this, keep_alive);
  Handler handler = server_.router.route(request);
  std::optional<std::string> failure;  // co_await is not allowed inside a catch block
  try {
    co_await handler(request, writer);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (failure && !writer.started()) co_await writer.send(json_error(500, *failure, "server_error"));
  ++watch_generation_;  // a late watcher result belongs to this request only
  watch_cancel_.emit(asio::cancellation_type::terminal);
  on_disconnect_ = nullptr;

  if (!writer.started()) {
    co_await writer.send(json_error(500, "the handler sent no response", "server_error"));
  } else if (writer.streaming() && !writer.finished()) {
    if (failure) co_return false;  // no last chunk: the client sees a truncated stream
    co_await writer.finish();
  }
  co_return !client_gone_ && writer.keep_alive();
}

// While the handler runs nothing reads the socket, so a closed connection would go unnoticed
// until the next write. Waiting for readability catches the FIN (or RST) at once.
asio::awaitable<void> Session::watch_disconnect(uint64_t generation) {
  auto self = shared_from_this();
  for (;;) {
    auto [ec] = co_await stream_.socket().async_wait(
        asio::ip::tcp::socket::wait_read,
        asio::bind_cancellation_slot(watch_cancel_.slot(), tuple_awaitable));
    if (generation != watch_generation_ || ec == asio::error::operation_aborted) co_return;
    if (!ec) {
      // Never a blocking peek: a readiness report can be spurious, and asio's synchronous receive
      // on such a socket waits (in poll) for data that may never come, holding this io thread and
      // the session's strand until the client hangs up.
      char byte = 0;
      const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) co_return;  // a pipelined request: data, not a disconnect
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;  // spurious
    }
    break;  // EOF, reset or an error: the client is gone
  }
  mark_gone();
}

void Session::mark_gone() {
  if (client_gone_) return;
  client_gone_ = true;
  if (auto callback = std::move(on_disconnect_)) {
    on_disconnect_ = nullptr;
    callback();
  }
}

asio::awaitable<void> Session::answer_read_error(int status, std::string detail) {
  std::string message = status == 431   ? "request headers are too large"
                        : status == 413 ? "request body is too large"
                                        : "malformed HTTP request: " + detail;
  if (co_await write_error(status, message)) co_await linger_close();
}

asio::awaitable<bool> Session::write_error(int status, std::string_view message) {
  Response response = json_error(status, message, error_type_for(status));
  bhttp::response<bhttp::string_body> out{bhttp::status(status), 11};
  copy_headers(response.headers, out);
  out.body() = std::move(response.body);
  out.keep_alive(false);
  out.prepare_payload();
  stream_.expires_after(server_.config.write_timeout);
  auto [ec, n] = co_await bhttp::async_write(stream_, out, tuple_awaitable);
  co_return !ec;
}

// Closing with unread input makes the kernel send RST, which can destroy the error response
// before the client reads it. Half-close, then drain for a little while.
asio::awaitable<void> Session::linger_close() {
  error_code ec;
  stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  std::array<char, 16384> sink;
  size_t drained = 0;
  stream_.expires_after(std::min(server_.config.read_timeout, std::chrono::milliseconds{1000}));
  while (!ec && drained < 4 * server_.config.body_limit + 65536) {
    auto [read_ec, n] = co_await stream_.async_read_some(asio::buffer(sink), tuple_awaitable);
    ec = read_ec;
    drained += n;
  }
}

void Session::on_server_stop() {
  if (reading_ && parser_ && !parser_->got_some()) stream_.cancel();
}

void Session::force_close() {
  error_code ignored;
  stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  stream_.close();
}

}  // namespace kvfleet::http
