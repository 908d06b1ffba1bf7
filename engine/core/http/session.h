// Internal: one HTTP connection, run as a coroutine on its own strand (see server.h).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <optional>

#include "server_state.h"

namespace kvfleet::http {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::State& server, boost::asio::ip::tcp::socket socket);
  ~Session();

  boost::asio::any_io_executor executor() { return stream_.get_executor(); }

  // Reads requests and answers them until the connection ends.
  boost::asio::awaitable<void> run();

  // On the strand: the server stops. Closes the connection if it waits for a request that has
  // not begun; a running request finishes and the connection closes after it.
  void on_server_stop();
  // On the strand: the grace period is over.
  void force_close();

 private:
  friend class SessionWriter;
  using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

  boost::asio::awaitable<bool> serve(const Request& request, bool keep_alive);
  boost::asio::awaitable<void> answer_read_error(int status, std::string detail);
  boost::asio::awaitable<void> watch_disconnect(uint64_t generation);
  boost::asio::awaitable<bool> write_error(int status, std::string_view message);
  boost::asio::awaitable<void> linger_close();
  void mark_gone();

  HttpServer::State& server_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  bool reading_ = false;        // an async_read for the next request is pending

  // Per request: disconnect detection while the handler runs.
  bool client_gone_ = false;
  std::function<void()> on_disconnect_;
  uint64_t watch_generation_ = 0;
  boost::asio::cancellation_signal watch_cancel_;
};

}  // namespace kvfleet::http
