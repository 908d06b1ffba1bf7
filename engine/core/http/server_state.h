// Internal: what HttpServer shares with its connection coroutines.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvfleet/http/server.h"

namespace kvfleet::http {

class Session;

struct HttpServer::State {
  State(HttpServerConfig c, HttpRouter r) : config(std::move(c)), router(std::move(r)) {}

  void add_session(Session* session, std::weak_ptr<Session> weak) {
    std::lock_guard lock(mutex);
    sessions.emplace(session, std::move(weak));
  }
  void remove_session(Session* session) {
    std::lock_guard lock(mutex);
    sessions.erase(session);
    if (sessions.empty()) sessions_empty.notify_all();
  }

  size_t connection_count() const;

  const HttpServerConfig config;
  const HttpRouter router;
  std::atomic<bool> stopping{false};
  std::atomic<uint16_t> port{0};

  mutable std::mutex mutex;  // guards sessions, started, stopped
  std::condition_variable sessions_empty;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  bool started = false;
  bool stopped = false;
  std::vector<std::thread> threads;

  // Declared last so they are destroyed first: tearing down the io_context destroys pending
  // coroutine frames, whose sessions unregister through the members above.
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor acceptor{boost::asio::make_strand(ioc)};
};

}  // namespace kvfleet::http
