#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string_view>

#include "session.h"

namespace kvfleet::http {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

bool out_of_descriptors(const boost::system::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system ||
         ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
}

// An exception that ends a connection's coroutine ends that connection only (its frame, and with it
// the socket, is gone by now).
void log_session_exception(std::exception_ptr error) {
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvfleet-http: a connection ended by an exception: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kvfleet-http: a connection ended by an unknown exception\n");
  }
}

template <typename Socket>
std::string peer_address(const Socket& socket) {
  boost::system::error_code ec;
  tcp::endpoint endpoint = socket.remote_endpoint(ec);
  return ec ? std::string() : endpoint.address().to_string();
}

// Registers an accepted connection (or closes it, over the caps) and starts its coroutine on the socket's
// strand: an io thread's, or the priority lane's (`lane`).
void start_session(HttpServer::State& server, tcp::socket socket, std::chrono::steady_clock::time_point accepted,
                   bool lane, std::string_view already_read = {}) {
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);  // stream pieces must not wait for Nagle
  std::string peer = peer_address(socket);
  auto session = std::make_shared<Session>(server, std::move(socket));
  std::shared_ptr<Session> victim;
  ActivitySlot* slot = nullptr;
  const auto admission = server.add_session(session.get(), session, std::move(peer), victim, slot);
  if (victim) asio::post(victim->executor(), [victim] { victim->evict(); });
  if (admission == HttpServer::State::Admission::refused) return;  // closed on leaving scope
  session->set_activity_slot(slot);
  session->set_accepted_at(accepted);
  session->set_already_read(already_read);
  if (lane) session->set_lane();
  if (admission == HttpServer::State::Admission::probe_only) session->set_probe_only();
  // The handler holds the session until run() starts and takes its own reference: started from another
  // thread (the lane's), the coroutine begins later, not inside this call.
  asio::co_spawn(session->executor(), session->run(), [session](std::exception_ptr e) { log_session_exception(e); });
}

// The socket moved to an io thread's strand (from the lane's), and its session started there.
void move_to_io_threads(HttpServer::State& server, tcp::socket socket, std::chrono::steady_clock::time_point accepted,
                        std::string_view already_read) {
  boost::system::error_code ec;
  const tcp::endpoint local = socket.local_endpoint(ec);
  if (ec) return;
  const int fd = socket.release(ec);
  if (ec) return;
  tcp::socket moved(asio::make_strand(server.ioc));
  moved.assign(local.protocol(), fd, ec);
  if (ec) {
    ::close(fd);
    return;
  }
  start_session(server, std::move(moved), accepted, false, already_read);
}

// How long the lane waits for a new connection's first bytes before it hands the connection to the io
// threads unsorted. A probe sends its request as soon as it connects.
constexpr std::chrono::milliseconds first_bytes_window{250};

// The target of the request line at the start of `head`; empty while the line is incomplete.
std::string_view request_target(std::string_view head) {
  const size_t first = head.find(' ');
  if (first == std::string_view::npos) return {};
  const size_t end = head.find(' ', first + 1);
  if (end == std::string_view::npos) return {};
  return head.substr(first + 1, end - first - 1);
}

// The priority lane (server.h): on the lane's thread, looks at a new connection's first bytes without
// taking them (MSG_PEEK). A request line on a priority path is served right there; anything else (other
// paths, a line not complete yet, nothing within first_bytes_window) goes to the io threads, whose session
// then reads the request from its first byte.
asio::awaitable<void> sort_connection(HttpServer::State& server, tcp::socket socket,
                                      std::chrono::steady_clock::time_point accepted) {
  using namespace asio::experimental::awaitable_operators;
  asio::steady_timer window(socket.get_executor());
  window.expires_after(first_bytes_window);
  const auto first = co_await (socket.async_wait(tcp::socket::wait_read, asio::as_tuple(asio::use_awaitable)) ||
                               window.async_wait(asio::as_tuple(asio::use_awaitable)));
  bool priority = false;
  boost::system::error_code ec;
  if (first.index() == 0) {
    std::array<char, 1024> head;
    socket.non_blocking(true, ec);  // readiness can be spurious: never wait here
    const size_t n = ec ? 0 : socket.receive(asio::buffer(head), tcp::socket::message_peek, ec);
    priority = !ec && server.config.is_priority_path(request_target(std::string_view(head.data(), n)));
    socket.non_blocking(false, ec);
  }
  if (server.stopping) co_return;  // closed on leaving scope
  if (priority) {
    start_session(server, std::move(socket), accepted, true);
    co_return;
  }
  move_to_io_threads(server, std::move(socket), accepted, {});
}

// A connection just accepted: sorted by the lane when there are priority paths, else straight to the io threads.
void take_connection(HttpServer::State& server, tcp::socket socket) {
  const auto now = std::chrono::steady_clock::now();
  if (server.config.priority_paths.empty()) {
    start_session(server, std::move(socket), now, false);
    return;
  }
  asio::co_spawn(socket.get_executor(), sort_connection(server, std::move(socket), now), log_session_exception);
}

// Where accepted connections start: the io threads' strands, or the lane's while they are sorted.
asio::strand<asio::io_context::executor_type> accept_strand(HttpServer::State& server) {
  return asio::make_strand(server.config.priority_paths.empty() ? server.ioc : server.lane);
}

// Connections accepted per wake-up beyond the first. Under load every handler waits its turn behind the
// connections' reads and writes; accepting one connection per turn left thousands in the kernel's queue
// for seconds (a health probe among them), so each turn takes what the queue holds, up to this many.
constexpr int accept_batch = 256;

asio::awaitable<void> accept_loop(HttpServer::State& server) {
  asio::steady_timer pause(server.acceptor.get_executor());
  std::chrono::milliseconds backoff{0};
  for (;;) {
    auto [ec, socket] = co_await server.acceptor.async_accept(accept_strand(server), asio::as_tuple(asio::use_awaitable));
    if (ec == asio::error::operation_aborted || !server.acceptor.is_open()) co_return;
    if (out_of_descriptors(ec)) {
      // The connection stays in the backlog and accept fails again at once: retrying now would
      // spin. Pause, doubling, until descriptors are free again.
      backoff = std::min(std::max(backoff * 2, server.config.accept_backoff), std::chrono::milliseconds{1000});
      if (backoff == server.config.accept_backoff) {
        std::fprintf(stderr, "kvfleet-http: accept: %s; pausing accepts\n", ec.message().c_str());
      }
      pause.expires_after(backoff);
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      continue;
    }
    backoff = std::chrono::milliseconds{0};
    if (ec) continue;  // e.g. the peer reset before accept
    if (server.stopping) continue;  // closed on leaving scope
    take_connection(server, std::move(socket));
    // The rest of the kernel's queue, without waiting (the acceptor is non-blocking): would_block ends
    // the batch, and any other error is left to the next async_accept, which handles it as above.
    for (int i = 0; i < accept_batch && !server.stopping; ++i) {
      tcp::socket more(accept_strand(server));
      server.acceptor.accept(more, ec);
      if (ec) break;
      take_connection(server, std::move(more));
    }
  }
}

// Posts `fn(session)` to every live session's strand.
template <typename Fn>
void for_each_session(HttpServer::State& server, Fn fn) {
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(server.mutex);
    for (auto& [raw, entry] : server.sessions) {
      if (auto session = entry.session.lock()) live.push_back(std::move(session));
    }
  }
  for (auto& session : live) {
    asio::post(session->executor(), [session, fn] { fn(*session); });
  }
}

// The last resort: an exception thrown by a completion handler (not inside a coroutine, where the
// session catches it) leaves io_context::run(); log it and keep the thread serving the others.
void run_io(asio::io_context& ioc) {
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvfleet-http: an io thread caught an exception: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "kvfleet-http: an io thread caught an unknown exception\n");
    }
  }
}

}  // namespace

void to_io_threads(HttpServer::State& server, tcp::socket socket, std::string_view already_read) {
  move_to_io_threads(server, std::move(socket), std::chrono::steady_clock::now(), already_read);
}

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
  s.acceptor.non_blocking(true);  // accept_loop drains the queue in batches
  s.port = s.acceptor.local_endpoint().port();
  asio::co_spawn(s.acceptor.get_executor(), accept_loop(s), asio::detached);
  int threads = std::max(1, s.config.io_threads);
  for (int i = 0; i < threads; ++i) {
    s.threads.emplace_back([&s] { run_io(s.ioc); });
  }
  s.threads.emplace_back([&s] { run_io(s.lane); });  // the acceptor's, and the priority lane's
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
  s.lane.stop();
  for (std::thread& t : s.threads) t.join();
  s.threads.clear();
  return clean;
}

}  // namespace kvfleet::http
