// The Gloo Communicator: one rank per process over Gloo's TCP transport (the library PyTorch uses for CPU
// collectives). Rendezvous through our TCP store (tcp_store.h) on the master address: rank 0 serves it
// for the communicator's lifetime. Every Gloo call runs under the context's timeout, and any failure
// (a peer's connection reset when it exits, or the timeout when it stops answering) becomes a
// CommunicatorError naming this rank and the collective; after one, the communicator refuses every call.
// Variable all-to-all = an all-gather of the size x size byte-count matrix, then gloo::alltoallv.
// Gloo writes to its sockets with writev, which raises SIGPIPE when the peer has gone: by default that
// kills the process before Gloo can report anything. So each communicator sets SIGPIPE to ignored
// (process-wide, unless the process installed a handler of its own), and a lost peer is an EPIPE that
// Gloo reports and we turn into the CommunicatorError above.
#include "kvfleet/communicator.h"

#include <csignal>

#if KVFLEET_HAVE_GLOO
#include <gloo/allgather.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#endif

#include "engine/comm/tcp_store.h"

namespace kvfleet {

#if KVFLEET_HAVE_GLOO
namespace {

// gloo::rendezvous::Store over our TCP store's client.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(comm::TcpStoreClient& c) : c_(c) {}
  void set(const std::string& key, const std::vector<char>& data) override { c_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return c_.get(key); }
  void wait(const std::vector<std::string>& keys) override { c_.wait(keys, c_.timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    c_.wait(keys, timeout);
  }

 private:
  comm::TcpStoreClient& c_;
};

bool loopback(const std::string& host) { return host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1"; }

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const GlooOptions& o) : rank_(o.rank), size_(o.size) {
    if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
      throw std::invalid_argument("--ep-rank " + std::to_string(o.rank) + " is outside --ep-size " + std::to_string(o.size));
    const auto [host, port] = comm::parse_host_port(o.master);
    if (o.rank == 0) server_ = std::make_unique<comm::TcpStoreServer>(host, port);
    comm::TcpStoreClient client(host, port, o.join());
    StoreAdapter store(client);
    gloo::transport::tcp::attr attr;
    attr.hostname = !o.bind_host.empty() ? o.bind_host : loopback(host) ? "127.0.0.1" : "";
    guard("rendezvous", [&] {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      ctx->setTimeout(o.join());
      ctx->connectFullMesh(store, device);
      ctx->setTimeout(o.timeout);  // the collectives' from here on
      ctx_ = std::move(ctx);
    });
    barrier();  // every rank is connected: nobody needs the store any more, but rank 0 keeps it up anyway
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                         std::vector<std::size_t>& recv_bytes) override {
    if (static_cast<int>(send_bytes.size()) != size_)
      throw std::invalid_argument("all_to_all_v: one send count per rank expected");
    const auto n = static_cast<std::size_t>(size_);
    std::vector<std::int64_t> mine(send_bytes.begin(), send_bytes.end()), matrix(n * n);
    all_gather(mine.data(), n * sizeof(std::int64_t), matrix.data());
    recv_bytes.assign(n, 0);
    std::vector<std::int64_t> in(n), out(n);
    std::size_t total = 0, sent = 0;
    for (std::size_t r = 0; r < n; ++r) {
      in[r] = static_cast<std::int64_t>(send_bytes[r]);
      sent += send_bytes[r];
      recv_bytes[r] = static_cast<std::size_t>(matrix[r * n + static_cast<std::size_t>(rank_)]);
      out[r] = static_cast<std::int64_t>(recv_bytes[r]);
      total += recv_bytes[r];
    }
    std::vector<std::uint8_t> result(total);
    if (matrix_total(matrix) == 0) return result;  // every rank sends nothing: all skip alike
    std::uint8_t dummy_in = 0, dummy_out = 0;  // Gloo wants a buffer even for zero bytes
    guard("all_to_all_v", [&] {
      gloo::AlltoallvOptions opts(ctx_);
      opts.setInput(sent ? const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(send)) : &dummy_in, in);
      opts.setOutput(total ? result.data() : &dummy_out, out);
      opts.setTag(next_tag());
      gloo::alltoallv(opts);
    });
    return result;
  }

  void all_gather(const void* send, std::size_t bytes, void* recv) override {
    if (bytes == 0) return barrier();  // every rank passes the same size
    guard("all_gather", [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(send)), bytes);
      opts.setOutput(static_cast<std::uint8_t*>(recv), bytes * static_cast<std::size_t>(size_));
      opts.setTag(next_tag());
      gloo::allgather(opts);
    });
  }

  void barrier() override {
    guard("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

 private:
  static std::int64_t matrix_total(const std::vector<std::int64_t>& m) {
    std::int64_t t = 0;
    for (auto v : m) t += v;
    return t;
  }
  std::uint32_t next_tag() { return tag_++; }

  template <class F>
  void guard(const char* what, F&& f) {
    if (!broken_.empty()) throw CommunicatorError(broken_);
    try {
      f();
    } catch (const std::exception& e) {
      broken_ = "expert-parallel rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " + what +
                " failed (a peer rank exited or did not answer in time): " + e.what();
      throw CommunicatorError(broken_);
    }
  }

  int rank_, size_;
  std::unique_ptr<comm::TcpStoreServer> server_;
  std::shared_ptr<gloo::Context> ctx_;
  std::uint32_t tag_ = 1;
  std::string broken_;
};

}  // namespace

bool gloo_available() { return true; }

std::unique_ptr<Communicator> make_gloo_communicator(const GlooOptions& options) {
  struct sigaction now {};
  if (::sigaction(SIGPIPE, nullptr, &now) == 0 && now.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  return std::make_unique<GlooCommunicator>(options);
}

#else

bool gloo_available() { return false; }

std::unique_ptr<Communicator> make_gloo_communicator(const GlooOptions&) {
  throw std::runtime_error("this build has no Gloo (install libgloo-dev and configure again): --ep-rank needs it");
}

#endif

}  // namespace kvfleet
