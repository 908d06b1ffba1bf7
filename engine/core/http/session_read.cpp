// Reading one request: the idle wait, the head and the body, each under its own deadline, every
// byte through BoundedParser's limits, the head through check_request_head (see server.h).
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/http/write.hpp>

#include "kvfleet/http/json_error.h"
#include "request_checks.h"
#include "session.h"

namespace kvfleet::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::system::error_code;
constexpr auto tuple_awaitable = asio::as_tuple(asio::use_awaitable);

namespace {

std::string_view unread(const beast::flat_buffer& buffer) {
  return {static_cast<const char*>(buffer.data().data()), buffer.size()};
}

// The head as the handler sees it; the body is added once read. Trailers never get here.
void copy_head(const bhttp::request_header<>& head, Request& request) {
  request.method = std::string(head.method_string());
  request.target = std::string(head.target());
  request.headers = {};
  for (const auto& field : head) request.headers.add(field.name_string(), field.value());
}

}  // namespace

void Session::set_phase(Phase phase) {
  phase_ = phase;
  if (activity_) activity_->half_request.store(phase == Phase::idle || phase == Phase::head, std::memory_order_relaxed);
  touch();
}

std::chrono::milliseconds Session::timeout_or_default(std::chrono::milliseconds timeout) const {
  return timeout.count() > 0 ? timeout : server_.config.read_timeout;
}

// The caller answers `failure` (see Session::run).
asio::awaitable<bool> Session::read_request(Request& request, bool& keep_alive, ReadFailure& failure) {
  const HttpServerConfig& config = server_.config;
  RequestParser& parser = reader_.start(config.body_limit);
  set_phase(Phase::idle);
  // A connection's first request has header_timeout from accept; a later one idle_timeout for its
  // first byte, then header_timeout from there.
  const auto header_timeout = config.effective_header_timeout();
  Clock::time_point deadline = accepted_at_ + header_timeout;
  if (!first_request_ && buffer_.size() == 0) deadline = Clock::now() + timeout_or_default(config.idle_timeout);
  if (buffer_.size() == 0) {  // (never co_await in an operand of && or ?: : GCC 12 miscompiles it)
    ReadResult first = co_await read_more(deadline);
    if (first != ReadResult::data) co_return false;  // idle: closed without an answer
  }
  if (!first_request_) deadline = Clock::now() + header_timeout;
  set_phase(Phase::head);
  for (;;) {
    error_code ec = bhttp::error::need_more;
    if (buffer_.size() > 0) {
      size_t used = reader_.step(unread(buffer_), ec);
      buffer_.consume(used);
      if (!ec && used == 0) ec = bhttp::error::need_more;  // never spin on a step that made no progress
    }
    if (ec && ec != bhttp::error::need_more) {
      failure = parse_failure(ec);
      co_return false;
    }
    if (phase_ == Phase::head && parser.is_header_done()) {
      failure = check_request_head(parser.get());
      if (failure) co_return false;
      copy_head(parser.get(), request);
      request.from_loopback = peer_loopback_;
      keep_alive = parser.get().keep_alive();
      set_phase(Phase::body);
      if (!parser.is_done() && expects_continue(parser.get())) {
        bool written = co_await write_continue();
        if (!written) co_return false;
      }
      deadline = Clock::now() + timeout_or_default(config.body_timeout);
    }
    if (parser.is_done()) break;
    if (!ec && buffer_.size() > 0) continue;
    ReadResult result = co_await read_more(deadline);
    if (result == ReadResult::timeout) {
      failure = {408, phase_ == Phase::head ? "the request head did not arrive in time"
                                            : "the request body did not arrive in time"};
    }
    if (result != ReadResult::data) co_return false;
  }
  request.body = std::move(parser.get().body());
  reader_.reset();
  first_request_ = false;
  set_phase(Phase::serving);
  co_return true;
}

// Reads what the socket has into buffer_, until `deadline`: a timer cancels the read (tcp_stream's
// own expiry would close the socket, and a 408 could no longer be sent).
asio::awaitable<Session::ReadResult> Session::read_more(Clock::time_point deadline) {
  if (server_.stopping && phase_ == Phase::idle) co_return ReadResult::closed;
  if (Clock::now() >= deadline) co_return ReadResult::timeout;
  const uint64_t generation = ++read_generation_;
  timed_out_ = false;
  deadline_timer_.expires_at(deadline);
  deadline_timer_.async_wait([this, self = shared_from_this(), generation](error_code ec) {
    if (ec || generation != read_generation_) return;
    timed_out_ = true;
    error_code ignored;
    stream_.socket().cancel(ignored);
  });
  stream_.expires_never();  // a write's deadline must not carry over to this read
  auto buffers = buffer_.prepare(beast::read_size(buffer_, 64 * 1024));
  reading_ = true;
  auto [ec, n] = co_await stream_.async_read_some(buffers, tuple_awaitable);
  reading_ = false;
  ++read_generation_;
  deadline_timer_.cancel();
  buffer_.commit(n);
  if (n > 0) {
    touch();
    co_return ReadResult::data;
  }
  co_return timed_out_ && !server_.stopping ? ReadResult::timeout : ReadResult::closed;
}

asio::awaitable<bool> Session::write_continue() {
  static constexpr std::string_view continue_line = "HTTP/1.1 100 Continue\r\n\r\n";
  stream_.expires_after(server_.config.write_timeout);
  auto [ec, n] = co_await asio::async_write(stream_, asio::buffer(continue_line), tuple_awaitable);
  co_return !ec;
}

}  // namespace kvfleet::http
