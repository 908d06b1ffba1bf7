// The NCCL Communicator: one GPU rank per process (NVLink / InfiniBand / sockets, whatever NCCL finds).
// Rendezvous: rank 0 serves the TCP store (tcp_store.h) on the master address, makes the ncclUniqueId and
// publishes it (nccl_rendezvous.h); every rank reads it and joins with ncclCommInitRankConfig.
//
// Never hanging on a dead peer: the communicator is non-blocking (ncclConfig_t::blocking = 0), so every
// NCCL call returns at once and this file polls, under the timeout, ncclCommGetAsyncError (the enqueue and
// any asynchronous error) and then an event recorded after the work (its completion). A timeout or an
// error aborts the communicator (ncclCommAbort) and throws CommunicatorError naming the rank and the
// collective; every later call throws that message at once (as the Gloo communicator does).
//
// Memory: all_to_all_v_device takes device pointers and the caller's stream (the backend's, so the
// exchange is ordered after the kernels that produced the data); the host-memory collectives of the
// interface (the engine's votes, the count exchange) are staged through a device buffer on the
// communicator's own stream. Variable all-to-all = grouped ncclSend/ncclRecv per peer (ncclGroupStart/End),
// the own piece a device-to-device copy; host all_to_all_v first all-gathers the size x size byte counts.
// Each call waits for its completion before returning: the MoE path reads the routing back to the host in
// every layer anyway, and a wait we control is what bounds a dead peer.
#include "kvfleet/communicator.h"

#if KVFLEET_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "engine/comm/nccl_rendezvous.h"
#include "engine/comm/tcp_store.h"
#elif defined(KVFLEET_HAVE_CUDA)
#include "kernels/cuda/device_info.h"
#endif

namespace kvfleet {

#if KVFLEET_HAVE_NCCL
namespace {

using Clock = std::chrono::steady_clock;

void cuda(const char* call, cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(e));
}

// Spin briefly (a collective between busy ranks completes in microseconds), then sleep a little.
void pause(int spins) {
  if (spins < 64) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(spins < 1024 ? 20 : 200));
}

int visible_devices(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the CUDA backend probes again
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "0 devices";
  return n;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const NcclOptions& o) : rank_(o.rank), size_(o.size), timeout_(o.timeout) {
    try {
      join(o);
    } catch (...) {
      release();  // a constructor that throws runs no destructor
      throw;
    }
  }

  ~NcclCommunicator() override { release(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_memory() const override { return true; }

 private:
  void join(const NcclOptions& o) {
    device_ = pick_device(o);
    const auto [host, port] = comm::parse_host_port(o.master);
    if (rank_ == 0) server_ = std::make_unique<comm::TcpStoreServer>(host, port);
    ncclUniqueId id{};
    {
      comm::TcpStoreClient client(host, port, o.join());  // ranks may start minutes apart
      const std::vector<char> bytes = comm::share_unique_id(client, rank_, "nccl/unique_id", sizeof id.internal, [&] {
        ncclUniqueId made{};
        const ncclResult_t r = ncclGetUniqueId(&made);
        if (r != ncclSuccess) throw CommunicatorError(where() + "ncclGetUniqueId failed: " + ncclGetErrorString(r));
        return std::vector<char>(made.internal, made.internal + sizeof made.internal);
      });
      std::memcpy(id.internal, bytes.data(), sizeof id.internal);
    }
    guard("ncclCommInitRank", [&] {
      cuda("cudaSetDevice", cudaSetDevice(device_));
      cuda("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      cuda("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // we poll under our own deadline
      const auto deadline = Clock::now() + o.join();
      accept(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
      settle(deadline);
    });
    barrier();  // every rank is in: the store is not needed any more (rank 0 keeps it up anyway)
  }

  void release() {
    if (device_ >= 0) (void)cudaSetDevice(device_);
    if (comm_) {
      bool clean = false;  // Finalize flushes (bounded by the timeout), then Destroy; a broken group is aborted
      if (broken_.empty()) {
        const ncclResult_t r = ncclCommFinalize(comm_);
        clean = r == ncclSuccess || r == ncclInProgress;
      }
      if (clean) {
        const auto deadline = Clock::now() + timeout_;
        ncclResult_t st = ncclInProgress;
        for (int spins = 0; st == ncclInProgress && Clock::now() < deadline; ++spins) {
          if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) st = ncclInternalError;
          if (st == ncclInProgress) pause(spins);
        }
        clean = st == ncclSuccess;
      }
      if (clean) (void)ncclCommDestroy(comm_);
      else (void)ncclCommAbort(comm_);
    }
    if (scratch_) (void)cudaFree(scratch_);
    if (done_) (void)cudaEventDestroy(done_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    comm_ = nullptr;
    scratch_ = nullptr;
    done_ = nullptr;
    stream_ = nullptr;
  }

 public:
  void all_to_all_v_device(const void* d_send, const std::vector<std::size_t>& send_bytes, void* d_recv,
                           const std::vector<std::size_t>& recv_bytes, void* stream) override {
    check_counts(send_bytes, recv_bytes);
    guard("all_to_all_v", [&] {
      cuda("cudaSetDevice", cudaSetDevice(device_));
      cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : stream_;
      exchange(static_cast<const std::uint8_t*>(d_send), send_bytes, static_cast<std::uint8_t*>(d_recv), recv_bytes, s);
      complete(s);
    });
  }

  std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                         std::vector<std::size_t>& recv_bytes) override {
    if (static_cast<int>(send_bytes.size()) != size_)
      throw std::invalid_argument("all_to_all_v: one send count per rank expected");
    const auto n = static_cast<std::size_t>(size_);
    std::vector<std::int64_t> mine(send_bytes.begin(), send_bytes.end()), matrix(n * n);
    all_gather(mine.data(), n * sizeof(std::int64_t), matrix.data());
    recv_bytes.assign(n, 0);
    std::size_t sent = 0, total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      sent += send_bytes[r];
      total += recv_bytes[r] = static_cast<std::size_t>(matrix[r * n + static_cast<std::size_t>(rank_)]);
    }
    check_counts(send_bytes, recv_bytes);
    std::vector<std::uint8_t> result(total);
    if (sent + total == 0) return result;
    guard("all_to_all_v", [&] {
      cuda("cudaSetDevice", cudaSetDevice(device_));
      auto* d = scratch(sent + total);
      if (sent) cuda("cudaMemcpyAsync", cudaMemcpyAsync(d, send, sent, cudaMemcpyHostToDevice, stream_));
      exchange(d, send_bytes, d + sent, recv_bytes, stream_);
      if (total) cuda("cudaMemcpyAsync", cudaMemcpyAsync(result.data(), d + sent, total, cudaMemcpyDeviceToHost, stream_));
      complete(stream_);
    });
    return result;
  }

  void all_gather(const void* send, std::size_t bytes, void* recv) override {
    if (bytes == 0) return barrier();  // every rank passes the same size
    guard("all_gather", [&] {
      cuda("cudaSetDevice", cudaSetDevice(device_));
      const std::size_t all = bytes * static_cast<std::size_t>(size_);
      auto* d = scratch(bytes + all);
      cuda("cudaMemcpyAsync", cudaMemcpyAsync(d, send, bytes, cudaMemcpyHostToDevice, stream_));
      const auto deadline = Clock::now() + timeout_;
      accept(ncclAllGather(d, d + bytes, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
      settle(deadline);
      cuda("cudaMemcpyAsync", cudaMemcpyAsync(recv, d + bytes, all, cudaMemcpyDeviceToHost, stream_));
      complete(stream_);
    });
  }

  // A one-element all-reduce: returns once every rank has made it.
  void barrier() override {
    guard("barrier", [&] {
      cuda("cudaSetDevice", cudaSetDevice(device_));
      auto* d = reinterpret_cast<std::int32_t*>(scratch(sizeof(std::int32_t)));
      cuda("cudaMemsetAsync", cudaMemsetAsync(d, 0, sizeof(std::int32_t), stream_));
      const auto deadline = Clock::now() + timeout_;
      accept(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce");
      settle(deadline);
      complete(stream_);
    });
  }

 private:
  std::string where() const {
    return "expert-parallel rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (NCCL" +
           (device_ >= 0 ? ", device " + std::to_string(device_) : std::string()) + "): ";
  }

  int pick_device(const NcclOptions& o) {
    if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
      throw std::invalid_argument("--ep-rank " + std::to_string(o.rank) + " is outside --ep-size " + std::to_string(o.size));
    std::string why;
    const int n = visible_devices(&why);
    if (n == 0) throw CommunicatorError(where() + "NCCL needs a CUDA device and this process sees none (" + why + ")");
    const int d = o.device >= 0 ? o.device : o.rank % n;
    if (d >= n)
      throw CommunicatorError(where() + "device " + std::to_string(d) + " asked for, " + std::to_string(n) + " visible");
    return d;
  }

  void check_counts(const std::vector<std::size_t>& send, const std::vector<std::size_t>& recv) const {
    if (static_cast<int>(send.size()) != size_ || static_cast<int>(recv.size()) != size_)
      throw std::invalid_argument("all_to_all_v: one send and one receive count per rank expected");
    if (send[static_cast<std::size_t>(rank_)] != recv[static_cast<std::size_t>(rank_)])
      throw std::invalid_argument("all_to_all_v: the piece a rank sends itself must be the piece it receives");
  }

  // The pieces for the other ranks as one NCCL group (a dead peer shows in complete()); our own by a copy.
  void exchange(const std::uint8_t* send, const std::vector<std::size_t>& send_bytes, std::uint8_t* recv,
                const std::vector<std::size_t>& recv_bytes, cudaStream_t s) {
    std::size_t so = 0, ro = 0, self_send = 0, self_recv = 0;
    bool any = false;
    const auto deadline = Clock::now() + timeout_;
    accept(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      const std::size_t sn = send_bytes[static_cast<std::size_t>(r)], rn = recv_bytes[static_cast<std::size_t>(r)];
      if (r == rank_) {
        self_send = so;
        self_recv = ro;
      } else {
        if (sn) accept(ncclSend(send + so, sn, ncclUint8, r, comm_, s), "ncclSend");
        if (rn) accept(ncclRecv(recv + ro, rn, ncclUint8, r, comm_, s), "ncclRecv");
        any = any || sn || rn;
      }
      so += sn;
      ro += rn;
    }
    accept(ncclGroupEnd(), "ncclGroupEnd");
    if (any) settle(deadline);
    if (const std::size_t n = send_bytes[static_cast<std::size_t>(rank_)])
      cuda("cudaMemcpyAsync", cudaMemcpyAsync(recv + self_recv, send + self_send, n, cudaMemcpyDeviceToDevice, s));
  }

  void accept(ncclResult_t r, const char* call) const {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    throw std::runtime_error(std::string(call) + ": " + ncclGetErrorString(r) + (last && *last ? std::string(" (") + last + ")" : ""));
  }

  // A non-blocking communicator's state leaves ncclInProgress once the calls made are enqueued (or
  // initialisation finished); an error state is the asynchronous error.
  void settle(Clock::time_point deadline) const {
    for (int spins = 0;; ++spins) {
      ncclResult_t st = ncclSuccess;
      accept(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
      if (st == ncclSuccess) return;
      accept(st, "NCCL (asynchronous error)");
      if (Clock::now() > deadline) throw std::runtime_error(timed_out());
      pause(spins);
    }
  }

  // Waits for what was queued on `s`, watching for NCCL's asynchronous errors and the deadline.
  void complete(cudaStream_t s) const {
    cuda("cudaEventRecord", cudaEventRecord(done_, s));
    const auto deadline = Clock::now() + timeout_;
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda("cudaEventQuery", q);
      ncclResult_t st = ncclSuccess;
      accept(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
      accept(st, "NCCL (asynchronous error)");
      if (Clock::now() > deadline) throw std::runtime_error(timed_out());
      pause(spins);
    }
  }

  std::string timed_out() const {
    return "no completion within " + std::to_string(timeout_.count()) + " ms";
  }

  std::uint8_t* scratch(std::size_t bytes) {
    if (bytes > scratch_cap_) {
      if (scratch_) {
        cuda("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
        cuda("cudaFree", cudaFree(scratch_));
        scratch_ = nullptr;
      }
      scratch_cap_ = std::max<std::size_t>(bytes, 2 * scratch_cap_);
      cuda("cudaMalloc", cudaMalloc(&scratch_, scratch_cap_));
    }
    return static_cast<std::uint8_t*>(scratch_);
  }

  template <class F>
  void guard(const char* what, F&& f) {
    if (!broken_.empty()) throw CommunicatorError(broken_);
    try {
      f();
    } catch (const std::exception& e) {
      broken_ = where() + what + " failed (a peer rank exited or did not answer in time): " + e.what();
      if (comm_) (void)ncclCommAbort(comm_);  // frees NCCL's side; queued work never completes
      comm_ = nullptr;
      throw CommunicatorError(broken_);
    }
  }

  int rank_, size_, device_ = -1;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<comm::TcpStoreServer> server_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* scratch_ = nullptr;
  std::size_t scratch_cap_ = 0;
  std::string broken_;
};

}  // namespace

bool nccl_available() { return true; }

int nccl_default_device(int rank) {
  const int n = visible_devices(nullptr);
  return n > 0 ? rank % n : -1;
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclOptions& options) {
  return std::make_unique<NcclCommunicator>(options);
}

#else

bool nccl_available() { return false; }

int nccl_default_device(int rank) {
#ifdef KVFLEET_HAVE_CUDA
  const int n = cuda_device_count();
  return n > 0 ? rank % n : -1;
#else
  (void)rank;
  return -1;
#endif
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size)
    throw std::invalid_argument("--ep-rank " + std::to_string(options.rank) + " is outside --ep-size " +
                                std::to_string(options.size));
  throw CommunicatorError(
      "expert-parallel rank " + std::to_string(options.rank) + " of " + std::to_string(options.size) +
      ": this build has no NCCL (configure with KVFLEET_CUDA on where nccl.h and libnccl are found), use --ep-comm gloo");
}

#endif

}  // namespace kvfleet
