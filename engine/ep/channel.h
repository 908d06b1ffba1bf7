// The request channel between rank 0 of a multi-process expert-parallel group and each other rank
// (kvfleet-replica --ep-rank R): one TCP connection per rank r > 0, which rank r listens for on a port it
// publishes in the group's rendezvous store (engine/comm/tcp_store.h) and rank 0 connects to.
//
// Frames: u32 little-endian length, then that many bytes of one JSON object with a "t" (type) member.
// What travels (ep/wire.h has the bodies):
//   rank 0 -> r:  submit {id, req} | abort {id} | abort_all {error} | vote | query {id, what: kv_state|stats} | ping
//   r -> rank 0:  ack {id, error?, invalid?} | out {id, o} (one RequestOutput) | kv {type, h, p} (one of the
//                 rank's KV events) | stats {s} (its EngineStats, every kStatsPeriod) | ring |
//                 answer {id, a} (a query's: kv_state_json, or {s: EngineStats}) | ping
// Liveness: each side sends at least every heartbeat (a ping when it has nothing else) and takes a peer
// that sends nothing within the timeout (or closes, or resets) as gone.
//
// Threading: a reader thread calls the handler per message; `closed` runs once (reader or writer thread,
// whichever saw the end first; never after the destructor began). A writer thread sends what
// send() queued (never blocking the caller, e.g. an engine thread's output callback).
#pragma once

#include <boost/json.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace kvfleet::ep {

using Message = boost::json::object;

class Channel {
 public:
  using Handler = std::function<void(Message& message)>;
  using Closed = std::function<void(const std::string& why)>;
  // Takes the connected socket `fd`. Nothing runs before start().
  Channel(int fd, std::chrono::milliseconds timeout, Handler on_message, Closed on_closed);
  ~Channel();  // closes the socket and joins the threads (never call it from the handler)
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void start();
  void send(Message message);  // any thread; dropped once the channel is closed
  bool closed() const;

 private:
  void read_loop();
  void write_loop();
  void end(const std::string& why);  // first caller reports `why` (unless close was ours)

  int fd_;
  std::chrono::milliseconds timeout_, heartbeat_;
  Handler on_message_;
  Closed on_closed_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool ended_ = false, closing_ = false;
  std::thread reader_, writer_;
};

// Sockets. Each throws std::runtime_error with a message naming the address on failure.
int listen_tcp(const std::string& host, unsigned short& port);  // port 0: any (written back)
int accept_tcp(int listen_fd, std::chrono::milliseconds timeout);
int connect_tcp(const std::string& host, unsigned short port, std::chrono::milliseconds timeout);  // retries
// An address other machines can reach this one at: `bind` when given, 127.0.0.1 when the master is on
// loopback, else the first IPv4 address of the host name.
std::string reachable_address(const std::string& bind, const std::string& master_host);

}  // namespace kvfleet::ep
