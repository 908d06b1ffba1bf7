// The in-process Communicator: ranks are threads of one process sharing a Group. A collective posts the
// rank's buffer, waits at a barrier, copies what it needs straight from the other ranks' buffers, and
// waits at a second barrier before returning so that no rank reuses its buffer while another still reads it.
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>

#include "kvfleet/communicator.h"

namespace kvfleet {
namespace {

struct Group {
  explicit Group(int n) : size(n), posted(static_cast<std::size_t>(n)), posted_bytes(static_cast<std::size_t>(n)) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t generation = 0;
  std::vector<const std::uint8_t*> posted;             // per rank: its send buffer in the current collective
  std::vector<std::vector<std::size_t>> posted_bytes;  // per rank: its piece sizes
  std::mutex ring_mu;  // guards handlers; held while one runs, so removing a handler waits for it
  std::vector<std::function<void()>> handlers = std::vector<std::function<void()>>(static_cast<std::size_t>(size));

  void barrier() {
    std::unique_lock lock(mu);
    const std::uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen; });
  }
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                         std::vector<std::size_t>& recv_bytes) override {
    if (static_cast<int>(send_bytes.size()) != g_->size)
      throw std::invalid_argument("all_to_all_v: one send count per rank expected");
    post(send, send_bytes);
    g_->barrier();
    recv_bytes.assign(static_cast<std::size_t>(g_->size), 0);
    std::size_t total = 0;
    for (int src = 0; src < g_->size; ++src) total += recv_bytes[static_cast<std::size_t>(src)] = piece(src, rank_);
    std::vector<std::uint8_t> out(total);
    std::size_t at = 0;
    for (int src = 0; src < g_->size; ++src) {
      const auto& sizes = g_->posted_bytes[static_cast<std::size_t>(src)];
      std::size_t offset = 0;
      for (int r = 0; r < rank_; ++r) offset += sizes[static_cast<std::size_t>(r)];
      const std::size_t n = sizes[static_cast<std::size_t>(rank_)];
      if (n) std::memcpy(out.data() + at, g_->posted[static_cast<std::size_t>(src)] + offset, n);
      at += n;
    }
    g_->barrier();
    return out;
  }

  void all_gather(const void* send, std::size_t bytes, void* recv) override {
    post(send, std::vector<std::size_t>(static_cast<std::size_t>(g_->size), bytes));
    g_->barrier();
    for (int src = 0; src < g_->size; ++src)
      if (bytes) std::memcpy(static_cast<std::uint8_t*>(recv) + static_cast<std::size_t>(src) * bytes,
                             g_->posted[static_cast<std::size_t>(src)], bytes);
    g_->barrier();
  }

  void barrier() override { g_->barrier(); }

  bool can_ring() const override { return true; }
  void set_ring_handler(std::function<void()> handler) override {
    std::lock_guard lock(g_->ring_mu);
    g_->handlers[static_cast<std::size_t>(rank_)] = std::move(handler);
  }
  void ring() override {
    std::lock_guard lock(g_->ring_mu);
    for (int r = 0; r < g_->size; ++r)
      if (r != rank_ && g_->handlers[static_cast<std::size_t>(r)]) g_->handlers[static_cast<std::size_t>(r)]();
  }

 private:
  void post(const void* send, std::vector<std::size_t> sizes) {
    std::lock_guard lock(g_->mu);  // the slots are read only after the barrier that follows
    g_->posted[static_cast<std::size_t>(rank_)] = static_cast<const std::uint8_t*>(send);
    g_->posted_bytes[static_cast<std::size_t>(rank_)] = std::move(sizes);
  }
  std::size_t piece(int src, int dst) const {
    return g_->posted_bytes[static_cast<std::size_t>(src)][static_cast<std::size_t>(dst)];
  }

  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size) {
  if (size <= 0) throw std::invalid_argument("an expert-parallel group needs at least one rank");
  auto g = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<InProcessCommunicator>(g, r));
  return out;
}

}  // namespace kvfleet
