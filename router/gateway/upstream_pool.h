// UpstreamPool: one replica's idle keep-alive connections, so that a request skips the TCP connect
// (and the replica's accept) that dominated the router's added latency. A connection is reused only by
// the same client connection (the same strand): a keep-alive client's requests share one upstream.
//
// A connection comes back only when its response was read to the end with clean framing
// (HttpClient::reusable()); one whose client went away, that failed, or that answered with
// Connection: close is closed instead. Closing, not pooling, is what aborts a request on the
// replica, so a client disconnect still frees the replica's work. Idle connections are reused
// newest first (the warmest, least likely to have been closed by the replica) and closed after
// idle_timeout, which should stay below the replica's keep-alive read timeout (30 s by default).
// A reused connection can still turn out stale (the replica closed it just as we sent); the proxy
// retries such a request once on a fresh connection (see forward() in proxy.cpp).
//
// Threading: every member may be called from any thread (one internal mutex, never held across I/O
// or while a connection is destroyed).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "kvfleet/http/client.h"

namespace kvfleet::router {

struct UpstreamPoolConfig {
  std::size_t max_idle = 64;  // idle connections kept per replica; 0 turns reuse off
  std::chrono::milliseconds idle_timeout{20'000};
};

class UpstreamPool {
 public:
  using Clock = std::chrono::steady_clock;
  explicit UpstreamPool(UpstreamPoolConfig config) : config_(config) {}

  // The newest idle connection younger than idle_timeout that is already on `executor` (the strand
  // of the client connection whose earlier request used it); nullptr if none. Connections are not
  // moved between strands: doing so (a descriptor released into a new socket object) left some upstream
  // operations never completing.
  std::unique_ptr<http::HttpClient> take(const boost::asio::any_io_executor& executor, Clock::time_point now = Clock::now());
  // Keeps `client` for reuse if it is reusable() (closing the oldest idle one when full); closes it otherwise.
  void give_back(std::unique_ptr<http::HttpClient> client, Clock::time_point now = Clock::now());
  // Closes the connections idle longer than idle_timeout (the router's maintenance loop calls it).
  void prune(Clock::time_point now = Clock::now());
  void clear();  // the replica was removed
  std::size_t idle() const;

 private:
  struct Idle {
    std::unique_ptr<http::HttpClient> client;
    Clock::time_point since;
  };
  // Moves the entries idle since before `now - idle_timeout` into `out`, to be closed outside the lock.
  void take_expired(Clock::time_point now, std::vector<Idle>& out);

  const UpstreamPoolConfig config_;
  mutable std::mutex mutex_;
  std::vector<Idle> idle_;  // oldest first
};

}  // namespace kvfleet::router
