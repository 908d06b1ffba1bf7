// Collectives between the ranks of an expert-parallel group (docs/architecture.md, Contract 6). Every rank calls the
// same collectives in the same order; a call returns once every rank has made it (each call is also a
// barrier). Buffers are host memory, but for all_to_all_v_device (device memory, for NCCL).
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

  // Device memory (NCCL ranks and the CUDA expert-parallel path). device_memory(): whether this
  // communicator wants device buffers; MoeLayers then exchanges on the device instead of staging through
  // the host. all_to_all_v_device: like all_to_all_v, but d_send and d_recv are device memory of this
  // rank's backend and the receiver already knows recv_bytes (from an exchange of counts before); the
  // pieces land in d_recv back to back in source-rank order. `stream` is the backend's stream
  // (Backend::stream_handle(): a cudaStream_t; null for the CPU backend); the call returns once the data is
  // in d_recv. Not a barrier: pieces of 0 bytes are not sent. The default is for host-addressable
  // "device" memory (the CPU backend): all_to_all_v, then a copy, checking that recv_bytes matched.
  virtual bool device_memory() const { return false; }
  virtual void all_to_all_v_device(const void* d_send, const std::vector<std::size_t>& send_bytes, void* d_recv,
                                   const std::vector<std::size_t>& recv_bytes, void* stream);

  // Waking an idle group. Engines whose group has no work sleep instead of voting every millisecond when
  // their communicator can ring: ring() (any thread) calls every other rank's handler, which wakes that
  // rank's engine. A communicator that cannot (Gloo: the ranks are other processes) leaves its engines
  // polling. set_ring_handler(nullptr) removes the handler; no call of it runs once that returns.
  // vote_requested(): whether a ring that woke this rank still asks it to vote. A rank that votes only
  // when the group asks (a paced rank r > 0: on rank 0's ticket) says no once the vote the ring was for
  // has been taken, so that a ring arriving while its engine was on its way to that vote anyway does not
  // send it into a vote nobody else comes to; by default every ring does.
  virtual bool can_ring() const { return false; }
  virtual void set_ring_handler(std::function<void()> /*handler*/) {}
  virtual void ring() {}
  virtual bool vote_requested() const { return true; }
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
// std::runtime_error in a build without Gloo. Sets SIGPIPE to ignored if it had the default action
// (Gloo's writev to a peer that has gone would otherwise kill the process instead of failing the call).
std::unique_ptr<Communicator> make_gloo_communicator(const GlooOptions& options);

// One GPU rank per process over NCCL (engine/comm/nccl_communicator.cpp). Rendezvous as Gloo's: rank 0
// serves the TCP store on `master`, makes the ncclUniqueId and publishes it; every rank reads it and calls
// ncclCommInitRank (non-blocking, under the timeout). Collectives run on the communicator's stream of
// `device` (all_to_all_v_device on the caller's); host buffers are staged through device memory. Errors
// (ncclCommGetAsyncError, or no completion within the timeout: the communicator is aborted) throw
// CommunicatorError naming the rank and the collective, and the communicator refuses every later call.
struct NcclOptions {
  int rank = 0;
  int size = 1;
  std::string master;  // HOST:PORT as GlooOptions::master
  int device = -1;     // CUDA device ordinal; -1: rank % visible devices (one GPU per local rank)
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds join_timeout{0};  // the rendezvous and ncclCommInitRank, when longer; 0: timeout
  std::chrono::milliseconds join() const { return std::max(timeout, join_timeout); }
};
// True when this build links NCCL (KVFLEET_CUDA and nccl.h + libnccl found at configure time).
bool nccl_available();
// The device NcclOptions{device = -1} gives `rank` (rank % visible devices); -1 when no device is visible.
int nccl_default_device(int rank);
// Blocks until all ranks joined. Throws CommunicatorError when the build has no NCCL, there is no usable
// CUDA device, or the rendezvous / ncclCommInitRank fails or times out; std::invalid_argument for a rank
// outside the size.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclOptions& options);

// One process rank, whichever communicator `kind` names (the --ep-comm flag): "gloo", "nccl", or "auto"
// (nccl when the rank's backend is CUDA, i.e. backend_kind "cuda", or "auto" with a CUDA device visible,
// and the build has NCCL; gloo otherwise: a CUDA rank over Gloo stages through the host). What kvfleet logits|generate --ep-rank call; for the replica too.
struct EpCommOptions {
  std::string kind = "auto";
  int rank = 0;
  int size = 1;
  std::string master;
  std::string bind_host;             // Gloo only
  std::string backend_kind = "cpu";  // BackendOptions::kind of this rank
  int device = -1;                   // NCCL only: as NcclOptions::device
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds join_timeout{0};  // as GlooOptions::join_timeout
};
// The checks that need nothing built (a config parser's): throws std::invalid_argument, saying what to do,
// for an unknown kind and for nccl on a CPU backend.
inline void check_ep_comm(const EpCommOptions& o) {
  if (o.kind != "gloo" && o.kind != "nccl" && o.kind != "auto")
    throw std::invalid_argument("--ep-comm '" + o.kind + "': use gloo, nccl or auto");
  if (o.kind == "nccl" && o.backend_kind == "cpu")
    throw std::invalid_argument("--ep-comm nccl exchanges device memory: it needs --backend cuda (or auto on a GPU); "
                                "CPU ranks use --ep-comm gloo");
}
// "gloo" or "nccl" for options. Throws std::invalid_argument as check_ep_comm, and for nccl in a build
// without NCCL.
std::string resolve_ep_comm(const EpCommOptions& options);
std::unique_ptr<Communicator> make_ep_communicator(const EpCommOptions& options);
// The same for a rank whose engine runs on `backend` (backend_kind taken from it): with NCCL, the rank's
// device (options.device, or rank % visible devices) is written into backend.device, so that the engine
// computes on the GPU the communicator exchanges from.
struct BackendOptions;
std::unique_ptr<Communicator> make_ep_communicator(EpCommOptions options, BackendOptions& backend);

}  // namespace kvfleet
