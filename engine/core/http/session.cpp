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
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>
#include <vector>

#include "kvfleet/http/json_error.h"

namespace kvfleet::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::use_awaitable;
using boost::system::error_code;
constexpr auto tuple_awaitable = asio::as_tuple(use_awaitable);

namespace {

template <typename Message>
void copy_headers(const Headers& from, Message& to) {
  for (const Headers::Field& f : from.fields()) to.insert(f.name, f.value);
}

}  // namespace

asio::awaitable<bool> ResponseWriter::write_pieces(std::span<const std::string_view> pieces) {
  for (const std::string_view p : pieces) {
    const bool ok = co_await write(p);  // (named: GCC 12, see client.h)
    if (!ok) co_return false;
  }
  co_return true;
}

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

  asio::awaitable<bool> write_pieces(std::span<const std::string_view> pieces) override {
    if (!streaming_ || finished_) throw std::logic_error("ResponseWriter::write_pieces outside a stream");
    if (session_.client_gone_) co_return false;
    std::vector<asio::const_buffer> buffers;
    buffers.reserve(pieces.size());
    for (const std::string_view p : pieces)
      if (!p.empty()) buffers.emplace_back(p.data(), p.size());
    if (buffers.empty()) co_return true;  // an empty chunk would end the stream
    session_.stream_.expires_after(session_.server_.config.write_timeout);
    auto [ec, n] = co_await asio::async_write(session_.stream_, bhttp::make_chunk(buffers), tuple_awaitable);
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
    : server_(server),
      stream_(std::move(socket)),
      reader_(ParseLimits{server.config.header_limit, server.config.trailer_limit,
                          server.config.chunk_extension_limit}),
      deadline_timer_(stream_.get_executor()),
      accepted_at_(Clock::now()),
      watch_done_(stream_.get_executor()) {
  buffer_.reserve(16 * 1024);
  boost::system::error_code ec;
  const asio::ip::address peer = stream_.socket().remote_endpoint(ec).address();
  if (!ec)
    peer_loopback_ = peer.is_loopback() || (peer.is_v6() && peer.to_v6().is_v4_mapped() &&
                                            asio::ip::make_address_v4(asio::ip::v4_mapped, peer.to_v6()).is_loopback());
}

Session::~Session() { server_.remove_session(this); }

asio::awaitable<void> Session::run() {
  auto self = shared_from_this();  // the connection lives while its coroutine does
  // The error answer is written out here, after the loop. GCC 12 miscompiled the helper coroutine
  // `if (co_await write_error(...)) co_await linger_close();` called from this loop (a frame was
  // resumed at 8 bytes past its address: SIGILL); the bool goes through a named variable.
  Request request;
  ReadFailure failure;
  bool keep_alive = false;
  bool complete = false;
  while (!server_.stopping) {
    request = Request();
    complete = co_await read_request(request, keep_alive, failure);
    if (!complete) break;
    if (probe_only_) {
      keep_alive = false;  // the reserve slot is freed after one answer
      if (!server_.config.is_priority_path(request.target)) {
        complete = false;
        failure = {503, "the server is at its connection limit; retry shortly"};
        break;
      }
    }
    bool again = co_await serve(request, keep_alive);
    if (!again || !keep_alive) break;
    if (lane_) {  // the lane served its one request: the connection goes on on the io threads
      const auto data = buffer_.data();
      const std::string rest(static_cast<const char*>(data.data()), data.size());
      to_io_threads(server_, std::move(stream_.socket()), rest);
      co_return;
    }
  }
  if (!complete && failure.status != 0) {
    bool written = co_await write_error(failure.status, failure.message);
    if (written) co_await linger_close();
  }
  error_code ignored;
  stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  stream_.close();
}

asio::awaitable<bool> Session::serve(const Request& request, bool keep_alive) {
  client_gone_ = false;
  on_disconnect_ = nullptr;
  uint64_t generation = ++watch_generation_;
  watching_ = true;
  watch_done_.expires_at(Clock::time_point::max());
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
  // Stop the watcher and wait for it: it reads into pipelined_, which the next request needs.
  ++watch_generation_;  // a late watcher result belongs to this request only
  watch_cancel_.emit(asio::cancellation_type::terminal);
  on_disconnect_ = nullptr;
  if (watching_) co_await watch_done_.async_wait(tuple_awaitable);
  take_pipelined();

  if (!writer.started()) {
    co_await writer.send(json_error(500, "the handler sent no response", "server_error"));
  } else if (writer.streaming() && !writer.finished()) {
    if (failure) co_return false;  // no last chunk: the client sees a truncated stream
    co_await writer.finish();
  }
  co_return !client_gone_ && !discarded_ && writer.keep_alive();
}

// While the handler runs nothing else reads the socket, so a closed connection would go unnoticed
// until the next write. The watcher reads: EOF or a reset marks the client gone at once. What it
// reads is the start of a pipelined request, kept up to pipeline_limit; past that it is discarded
// (and the connection ends after this request), but the watcher keeps reading, so a client that
// sends more and then leaves is still noticed. (Never a blocking peek: a spurious readiness made
// asio's synchronous receive wait in poll, holding an io thread and the strand.)
asio::awaitable<void> Session::watch_disconnect(uint64_t generation) {
  auto self = shared_from_this();
  bool gone = false;
  for (;;) {
    auto [ec, n] = co_await stream_.socket().async_read_some(
        asio::buffer(watch_buffer_), asio::bind_cancellation_slot(watch_cancel_.slot(), tuple_awaitable));
    // Bytes that arrived are kept even when the read completed just as serve() stopped the watcher: a
    // keep-alive client sends its next request the moment it has the response, and losing its start
    // leaves the connection waiting for a request that never comes.
    if (n > 0) {
      if (!discarded_ && pipelined_.size() + n <= pipeline_limit) {
        pipelined_.append(watch_buffer_.data(), n);
      } else {
        discarded_ = true;
      }
    }
    if (generation != watch_generation_ || ec == asio::error::operation_aborted) break;
    if (ec) {
      gone = true;  // EOF, reset or an error: the client is gone
      break;
    }
  }
  watching_ = false;
  watch_done_.cancel();
  if (gone) mark_gone();
}

// The watcher's bytes follow what the parser left in buffer_.
void Session::take_pipelined() {
  if (pipelined_.empty() || discarded_) return;
  auto space = buffer_.prepare(pipelined_.size());
  asio::buffer_copy(space, asio::buffer(pipelined_));
  buffer_.commit(pipelined_.size());
  pipelined_.clear();
}

void Session::mark_gone() {
  if (client_gone_) return;
  client_gone_ = true;
  if (auto callback = std::move(on_disconnect_)) {
    on_disconnect_ = nullptr;
    callback();
  }
}

void Session::on_server_stop() {
  if (reading_ && phase_ == Phase::idle) stream_.cancel();
}

void Session::evict() {
  if (phase_ != Phase::idle && phase_ != Phase::head) return;  // it finished its head meanwhile: keep it
  error_code ignored;
  stream_.socket().cancel(ignored);  // the pending read ends as `closed`: no answer
  stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
}

void Session::force_close() {
  error_code ignored;
  stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  stream_.close();
}

asio::awaitable<bool> Session::write_error(int status, std::string_view message) {
  Response response = json_error(status, message, error_type_for(status));
  bhttp::response<bhttp::string_body> out{bhttp::status(status), 11};
  for (const Headers::Field& f : response.headers.fields()) out.insert(f.name, f.value);
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

}  // namespace kvfleet::http
