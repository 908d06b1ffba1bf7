// Collectives between the ranks of an expert-parallel group (DESIGN.md Contract 6). Every rank calls the
// same collectives in the same order; a call returns once every rank has made it (each call is also a
// barrier). Buffers are host memory.
// Thread-safety: one Communicator per rank, used by that rank's thread only.
// Failure: a collective that cannot complete (a peer rank exited, or did not arrive within the timeout)
// throws CommunicatorError; the group is broken from then on (every later call throws at once).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvfleet {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Variable-count all-to-all: `send` holds size() pieces back to back, piece r (send_bytes[r] bytes) for
  // rank r. Returns what every rank sent to this one, back to back in source-rank order, with the size of
  // each piece in recv_bytes (resized to size()).
  virtual std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                                 std::vector<std::size_t>& recv_bytes) = 0;
  // recv (size() * bytes) = every rank's `bytes` bytes of send, in rank order.
  virtual void all_gather(const void* send, std::size_t bytes, void* recv) = 0;
  virtual void barrier() = 0;

  // Waking an idle group. Engines whose group has no work sleep instead of voting every millisecond when
  // their communicator can ring: ring() (any thread) calls every other rank's handler, which wakes that
  // rank's engine. A communicator that cannot (Gloo: the ranks are other processes) leaves its engines
  // polling. set_ring_handler(nullptr) removes the handler; no call of it runs once that returns.
  virtual bool can_ring() const { return false; }
  virtual void set_ring_handler(std::function<void()> /*handler*/) {}
  virtual void ring() {}
};

// A collective failed: the group cannot go on (engines fail their requests with this message).
class CommunicatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `size` ranks in one process (ranks as threads): communicators[r] is rank r's.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size);

// One rank per process (or machine) over Gloo's TCP transport. Rendezvous: rank 0 runs a small TCP
// key-value store on `master` (engine/comm/tcp_store.h) and every rank publishes its Gloo address there.
struct GlooOptions {
  int rank = 0;
  int size = 1;
  std::string master;     // HOST:PORT that rank 0 listens on and every rank connects to
  std::string bind_host;  // this rank's address for Gloo's pairs; empty: 127.0.0.1 for a loopback master, else
                          // the host name's address
  // Every collective and the rendezvous: a peer that does not answer within this fails the call.
  std::chrono::milliseconds timeout{30000};
  // The rendezvous alone, when longer (ranks that start minutes apart); 0: `timeout`.
  std::chrono::milliseconds join_timeout{0};
  std::chrono::milliseconds join() const { return std::max(timeout, join_timeout); }
};
// True when this build links Gloo (libgloo-dev found at configure time).
bool gloo_available();
// Blocks until all `size` ranks joined (or throws CommunicatorError after the timeout). Throws
// std::runtime_error in a build without Gloo.
std::unique_ptr<Communicator> make_gloo_communicator(const GlooOptions& options);

}  // namespace kvfleet
