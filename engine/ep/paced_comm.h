// Lockstep without polling for a group of processes. The engines of an expert-parallel group vote every
// turn (an all_gather: has work, stopping, leaving) and an idle group sleeps until a rank rings
// (Communicator::ring), which in process is a direct call. Across processes a ring travels over the
// request channel, late and possibly twice, and a rank that votes alone would wait in Gloo until the
// timeout broke the group. So rank 0 paces the votes: before each of its all_gathers it sends every rank
// a vote ticket over the channel, and rank r > 0 enters its k-th all_gather only once it holds rank 0's
// k-th ticket. A rank that wakes for nothing waits for a ticket, not in Gloo (no timeout runs), and a
// ticket also rings the rank, so every rank comes to each of rank 0's votes. A ticket that arrives while
// rank r's engine is already on its way to that vote still rings it; vote_requested() (tickets not yet
// voted on) lets the engine tell such a ring from one that asks for a vote, so that it does not enter a
// vote rank 0 never calls (the group would wait forever). News on rank r (a request
// rank 0 sent it, its own stop) rings rank 0 through the channel, and rank 0's vote brings everyone.
// Only all_gather is paced: the engine's vote is the one all_gather; the MoE layers' all_to_all_v(_device)
// calls follow a vote every rank made, so they line up by themselves.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kvfleet/communicator.h"

namespace kvfleet::ep {

class Channel;

// Rank 0's end of the channel to one rank r > 0, as the vote pacing sees it: vote tickets go out, rings
// come in. A RemoteRank (the replica), or a VoteLink (ep/paced_rank.h: kvfleet generate's bare process ranks).
class TicketLink {
 public:
  virtual ~TicketLink() = default;
  virtual void send_vote() = 0;                               // one vote ticket
  virtual void on_ring(std::function<void()> handler) = 0;  // runs (reader thread) when the rank rings
};

// Forwards the collectives to `inner`, and rings through a handler the engine sets.
class PacedCommunicator : public Communicator {
 public:
  explicit PacedCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                         std::vector<std::size_t>& recv_bytes) override;
  void barrier() override;
  bool device_memory() const override { return inner_.device_memory(); }
  void all_to_all_v_device(const void* d_send, const std::vector<std::size_t>& send_bytes, void* d_recv,
                           const std::vector<std::size_t>& recv_bytes, void* stream) override;
  bool can_ring() const override { return true; }
  void set_ring_handler(std::function<void()> handler) override;
  // From now on every collective throws CommunicatorError(why), and a waiting all_gather returns so.
  void shutdown(const std::string& why);

 protected:
  void call_ring_handler();
  void check_down(std::unique_lock<std::mutex>&) const;
  template <class F>
  auto watched(F&& f);
  Communicator& inner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string down_;
  std::function<void(const std::string&)> broken_;  // a failed collective (rank 0: fails the group)

 private:
  std::mutex handler_mu_;  // held while the handler runs: set_ring_handler(nullptr) waits for it
  std::function<void()> handler_;
};

// Rank 0's: sends the tickets (once the ranks are attached), and a ring from any rank wakes its engine.
// A failed collective calls `broken` (with the collective's error) before it throws.
class FrontCommunicator final : public PacedCommunicator {
 public:
  FrontCommunicator(Communicator& inner, std::function<void(const std::string&)> broken);
  void attach(const std::vector<TicketLink*>& remotes);  // all_gather waits for this
  void all_gather(const void* send, std::size_t bytes, void* recv) override;
  void ring() override {}  // rank 0's news: its own vote brings the others (the tickets ring them)

 private:
  std::vector<TicketLink*> remotes_;
  bool attached_ = false;
};

// Rank r > 0's: votes on tickets; ring() tells rank 0.
class WorkerCommunicator final : public PacedCommunicator {
 public:
  explicit WorkerCommunicator(Communicator& inner) : PacedCommunicator(inner) {}
  void attach(Channel* channel);
  void ticket();  // the channel brought one (reader thread)
  void all_gather(const void* send, std::size_t bytes, void* recv) override;
  void ring() override;
  bool vote_requested() const override;  // a ticket not yet voted on (or the group is down)

 private:
  Channel* channel_ = nullptr;
  std::uint64_t tickets_ = 0;
};

}  // namespace kvfleet::ep
