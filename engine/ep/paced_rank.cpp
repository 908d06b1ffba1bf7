// A bare process rank paced over a votes-only channel (ep/paced_rank.h).
#include "engine/ep/paced_rank.h"

#include <unistd.h>

#include <mutex>
#include <stdexcept>
#include <vector>

#include "engine/comm/tcp_store.h"
#include "engine/ep/channel.h"
#include "engine/ep/paced_comm.h"
#include "engine/ep/remote_rank.h"

namespace kvfleet::ep {
namespace {

// Rank 0's channel to one rank r > 0: tickets out, rings in.
class VoteLink final : public TicketLink {
 public:
  VoteLink(int fd, std::chrono::milliseconds timeout, Channel::Closed closed)
      : channel_(std::make_unique<Channel>(fd, timeout, [this](Message& m) { on_message(m); }, std::move(closed))) {
    channel_->start();
  }
  void send_vote() override { channel_->send(Message{{"t", "vote"}}); }
  void on_ring(std::function<void()> handler) override {
    std::lock_guard lock(mu_);
    ring_ = std::move(handler);
  }

 private:
  void on_message(Message& m) {
    if (m.at("t").as_string() != "ring") throw std::invalid_argument("unknown message type");
    std::function<void()> ring;
    {
      std::lock_guard lock(mu_);
      ring = ring_;
    }
    if (ring) ring();
  }
  std::mutex mu_;
  std::function<void()> ring_;
  std::unique_ptr<Channel> channel_;  // last: its threads stop before the rest goes
};

// The engine's communicator: the paced one (Front on rank 0, Worker elsewhere) over `inner`, and the
// channels that carry the tickets. Members go in reverse: channels first (their threads call the paced
// communicator), then the paced one, then the inner one.
class PacedRank final : public Communicator {
 public:
  PacedRank(std::unique_ptr<Communicator> inner, const PacedRankOptions& o) : inner_(std::move(inner)) {
    if (inner_->rank() == 0) join_front(o);
    else join_worker(o);
  }
  ~PacedRank() override {
    if (worker_) worker_->attach(nullptr);  // no ring goes to a channel that is closing
    channel_.reset();
    links_.clear();
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                         std::vector<std::size_t>& recv_bytes) override {
    return paced_->all_to_all_v(send, send_bytes, recv_bytes);
  }
  void all_gather(const void* send, std::size_t bytes, void* recv) override { paced_->all_gather(send, bytes, recv); }
  void barrier() override { paced_->barrier(); }
  bool device_memory() const override { return paced_->device_memory(); }
  void all_to_all_v_device(const void* d_send, const std::vector<std::size_t>& send_bytes, void* d_recv,
                           const std::vector<std::size_t>& recv_bytes, void* stream) override {
    paced_->all_to_all_v_device(d_send, send_bytes, d_recv, recv_bytes, stream);
  }
  bool can_ring() const override { return true; }
  void set_ring_handler(std::function<void()> handler) override { paced_->set_ring_handler(std::move(handler)); }
  void ring() override { paced_->ring(); }
  bool vote_requested() const override { return paced_->vote_requested(); }

 private:
  std::string who() const {
    return "expert-parallel rank " + std::to_string(rank()) + " of " + std::to_string(size()) + ": ";
  }
  static std::chrono::milliseconds join_of(const PacedRankOptions& o) { return std::max(o.timeout, o.join_timeout); }

  void join_front(const PacedRankOptions& o) {
    front_ = std::make_unique<FrontCommunicator>(*inner_, nullptr);
    paced_ = front_.get();
    const auto [host, port] = comm::parse_host_port(o.master);
    comm::TcpStoreClient store(host, port, join_of(o));
    std::vector<TicketLink*> peers;
    for (int r = 1; r < size(); ++r) {
      std::vector<char> where;
      try {
        where = store.get(channel_key(r));
      } catch (const std::exception& e) {
        throw std::runtime_error(who() + "rank " + std::to_string(r) + " did not publish its vote channel: " + e.what());
      }
      const auto [rhost, rport] = comm::parse_host_port(std::string(where.begin(), where.end()));
      const int fd = connect_tcp(rhost, rport, join_of(o));
      const std::string gone = who() + "rank " + std::to_string(r) + " is gone: ";
      links_.push_back(std::make_unique<VoteLink>(fd, o.timeout, [f = front_.get(), gone](const std::string& why) {
        f->shutdown(gone + why);
      }));
      peers.push_back(links_.back().get());
    }
    front_->attach(peers);
  }

  void join_worker(const PacedRankOptions& o) {
    worker_ = std::make_unique<WorkerCommunicator>(*inner_);
    paced_ = worker_.get();
    const auto [host, port] = comm::parse_host_port(o.master);
    const std::string address = reachable_address(o.bind_host, host);
    unsigned short own_port = 0;
    const int listen_fd = listen_tcp(o.bind_host.empty() && address != "127.0.0.1" ? "0.0.0.0" : address, own_port);
    int fd = -1;
    try {
      comm::TcpStoreClient store(host, port, join_of(o));
      const std::string where = address + ":" + std::to_string(own_port);
      store.set(channel_key(rank()), std::vector<char>(where.begin(), where.end()));
      fd = accept_tcp(listen_fd, join_of(o));
    } catch (...) {
      ::close(listen_fd);
      throw;
    }
    ::close(listen_fd);
    const std::string gone = who() + "rank 0 is gone: ";
    WorkerCommunicator* w = worker_.get();
    channel_ = std::make_unique<Channel>(
        fd, o.timeout,
        [w](Message& m) {
          if (m.at("t").as_string() != "vote") throw std::invalid_argument("unknown message type");
          w->ticket();
        },
        [w, gone](const std::string& why) { w->shutdown(gone + why); });
    worker_->attach(channel_.get());
    channel_->start();
  }

  std::unique_ptr<Communicator> inner_;
  std::unique_ptr<FrontCommunicator> front_;
  std::unique_ptr<WorkerCommunicator> worker_;
  PacedCommunicator* paced_ = nullptr;
  std::vector<std::unique_ptr<VoteLink>> links_;  // rank 0: one per rank r > 0
  std::unique_ptr<Channel> channel_;              // rank r > 0: to rank 0
};

}  // namespace

std::unique_ptr<Communicator> pace_process_rank(std::unique_ptr<Communicator> inner, const PacedRankOptions& options) {
  if (inner->size() == 1) return inner;  // a group of one votes alone: nothing to pace
  return std::make_unique<PacedRank>(std::move(inner), options);
}

}  // namespace kvfleet::ep
