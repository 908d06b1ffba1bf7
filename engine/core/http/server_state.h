// Internal: what HttpServer shares with its connection coroutines.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvfleet/http/server.h"

namespace kvfleet::http {

class Session;

struct HttpServer::State {
  State(HttpServerConfig c, HttpRouter r) : config(std::move(c)), router(std::move(r)) {}

  // Registers a new connection; false (and nothing registered) when it is over max_connections
  // or over max_connections_per_peer for `peer` (its address; empty: unknown, not capped).
  bool add_session(Session* session, std::weak_ptr<Session> weak, std::string peer) {
    std::lock_guard lock(mutex);
    if (sessions.size() >= config.max_connections) return false;
    if (config.max_connections_per_peer > 0 && !peer.empty()) {
      size_t& count = per_peer[peer];
      if (count >= config.max_connections_per_peer) return false;
      ++count;
    }
    sessions.emplace(session, Entry{std::move(weak), std::move(peer)});
    return true;
  }
  void remove_session(Session* session) {
    std::lock_guard lock(mutex);
    auto it = sessions.find(session);
    if (it == sessions.end()) return;
    if (auto peer = per_peer.find(it->second.peer); peer != per_peer.end() && --peer->second == 0) {
      per_peer.erase(peer);
    }
    sessions.erase(it);
    if (sessions.empty()) sessions_empty.notify_all();
  }

  size_t connection_count() const;

  const HttpServerConfig config;
  const HttpRouter router;
  std::atomic<bool> stopping{false};
  std::atomic<uint16_t> port{0};

  struct Entry {
    std::weak_ptr<Session> session;
    std::string peer;
  };
  mutable std::mutex mutex;  // guards sessions, per_peer, started, stopped
  std::condition_variable sessions_empty;
  std::unordered_map<Session*, Entry> sessions;
  std::unordered_map<std::string, size_t> per_peer;  // open connections per client address
  bool started = false;
  bool stopped = false;
  std::vector<std::thread> threads;

  // Declared last so they are destroyed first: tearing down the io_context destroys pending
  // coroutine frames, whose sessions unregister through the members above.
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor acceptor{boost::asio::make_strand(ioc)};
};

}  // namespace kvfleet::http
