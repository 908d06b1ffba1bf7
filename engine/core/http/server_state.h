// Internal: what HttpServer shares with its connection coroutines.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/strand.hpp>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <deque>
#include <vector>

#include "kvfleet/http/server.h"

namespace kvfleet::http {

class Session;

// A connection's activity, read under the server's lock to pick a half-request to close. Slots live in
// one deque (stable addresses, reused), so scanning an address's connections stays in a few cache lines
// instead of visiting every Session. Written by the connection's strand, read by the accept loop.
struct ActivitySlot {
  std::atomic<int64_t> last_active{0};  // steady clock ticks of the last byte read or phase change
  std::atomic<bool> half_request{true};  // idle or reading a head
  Session* session = nullptr;
  size_t peer_index = 0;  // where it is in its address's list
};

struct HttpServer::State {
  State(HttpServerConfig c, HttpRouter r) : config(std::move(c)), router(std::move(r)) {}

  // Where a new connection goes (connection_caps.cpp, see server.h): admitted, into the probe
  // reserve, or refused (nothing registered). `victim`: a half-request to close in its place (on its
  // strand, through Session::evict), already uncounted.
  enum class Admission { admitted, probe_only, refused };
  // `slot` gets the connection's ActivitySlot (always, also in the probe reserve) unless refused.
  Admission add_session(Session* session, std::weak_ptr<Session> weak, std::string peer,
                        std::shared_ptr<Session>& victim, ActivitySlot*& slot);
  void remove_session(Session* session);

  size_t connection_count() const;

  const HttpServerConfig config;
  const HttpRouter router;
  std::atomic<bool> stopping{false};
  std::atomic<uint16_t> port{0};

  struct Entry {
    std::weak_ptr<Session> session;
    std::string peer;
    ActivitySlot* slot = nullptr;
    bool counted = true;  // counts against the caps: not evicted, not in the probe reserve
    bool probe_only = false;  // in the probe reserve
  };
  mutable std::mutex mutex;  // guards everything below up to `threads`
  std::condition_variable sessions_empty;
  std::unordered_map<Session*, Entry> sessions;  // every open connection
  std::unordered_map<std::string, std::vector<ActivitySlot*>> per_peer;  // counted ones per client address
  std::deque<ActivitySlot> slots;         // every slot ever made; reused through free_slots
  std::vector<ActivitySlot*> free_slots;
  size_t counted = 0;      // counted connections in all
  size_t probe_only = 0;   // connections in the probe reserve
  bool started = false;
  bool stopped = false;
  std::vector<std::thread> threads;

  // Declared last so they are destroyed first: tearing down the io_contexts destroys pending
  // coroutine frames, whose sessions unregister through the members above. `ioc` runs on the io
  // threads; `lane` (the priority lane, see server.h) on one thread of its own, with the acceptor.
  boost::asio::io_context ioc;
  boost::asio::io_context lane;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> ioc_work{ioc.get_executor()};
  boost::asio::ip::tcp::acceptor acceptor{boost::asio::make_strand(lane)};
};

}  // namespace kvfleet::http
