#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "session.h"

namespace kvfleet::http {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

asio::awaitable<void> accept_loop(HttpServer::State& server) {
  for (;;) {
    auto [ec, socket] = co_await server.acceptor.async_accept(
        asio::make_strand(server.ioc), asio::as_tuple(asio::use_awaitable));
    if (ec == asio::error::operation_aborted || !server.acceptor.is_open()) co_return;
    if (ec) continue;  // e.g. the peer reset before accept, or out of descriptors for a moment
    if (server.stopping || server.connection_count() >= server.config.max_connections) {
      boost::system::error_code ignored;
      socket.close(ignored);
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);  // stream pieces must not wait for Nagle
    auto session = std::make_shared<Session>(server, std::move(socket));
    server.add_session(session.get(), session);
    asio::co_spawn(session->executor(), session->run(), asio::detached);
  }
}

// Posts `fn(session)` to every live session's strand.
template <typename Fn>
void for_each_session(HttpServer::State& server, Fn fn) {
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(server.mutex);
    for (auto& [raw, weak] : server.sessions) {
      if (auto session = weak.lock()) live.push_back(std::move(session));
    }
  }
  for (auto& session : live) {
    asio::post(session->executor(), [session, fn] { fn(*session); });
  }
}

}  // namespace

size_t HttpServer::State::connection_count() const {
  std::lock_guard lock(mutex);
  return sessions.size();
}

HttpServer::HttpServer(HttpServerConfig config, HttpRouter router)
    : state_(std::make_shared<State>(std::move(config), std::move(router))) {}

HttpServer::~HttpServer() { stop(std::chrono::milliseconds{0}); }

void HttpServer::start() {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    if (s.started) throw std::logic_error("HttpServer::start called twice");
    s.started = true;
  }
  tcp::endpoint endpoint{asio::ip::make_address(s.config.host), s.config.port};
  s.acceptor.open(endpoint.protocol());
  s.acceptor.set_option(tcp::acceptor::reuse_address(true));
  s.acceptor.bind(endpoint);
  s.acceptor.listen(asio::socket_base::max_listen_connections);
  s.port = s.acceptor.local_endpoint().port();
  asio::co_spawn(s.acceptor.get_executor(), accept_loop(s), asio::detached);
  int threads = std::max(1, s.config.io_threads);
  for (int i = 0; i < threads; ++i) {
    s.threads.emplace_back([&s] { s.ioc.run(); });
  }
}

uint16_t HttpServer::port() const { return state_->port; }

asio::any_io_executor HttpServer::executor() const { return state_->ioc.get_executor(); }

size_t HttpServer::connection_count() const { return state_->connection_count(); }

bool HttpServer::stop(std::chrono::milliseconds grace) {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    if (!s.started || s.stopped) return true;
    s.stopped = true;
  }
  s.stopping = true;
  asio::post(s.acceptor.get_executor(), [&s] {
    boost::system::error_code ignored;
    s.acceptor.close(ignored);
  });
  for_each_session(s, [](Session& session) { session.on_server_stop(); });
  bool clean;
  {
    std::unique_lock lock(s.mutex);
    clean = s.sessions_empty.wait_for(lock, grace, [&s] { return s.sessions.empty(); });
  }
  if (!clean) {
    for_each_session(s, [](Session& session) { session.force_close(); });
  }
  // Handlers that still wait (e.g. on an AsyncQueue nobody closes) are destroyed with the
  // io_context; their connections are closed by now.
  s.ioc.stop();
  for (std::thread& t : s.threads) t.join();
  s.threads.clear();
  return clean;
}

}  // namespace kvfleet::http
