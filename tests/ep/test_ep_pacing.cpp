// The paced votes of a group of processes (engine/ep/paced_comm.h), with two engines whose
// collectives run over an in-process inner group and whose tickets and rings are direct calls instead of
// a channel. The case that hung `kvfleet generate --ep-rank` in CI: a ticket that reaches rank 1 while its
// engine already waits in the vote the ticket is for. That vote finds the group idle; the ticket's ring
// must not then send rank 1 into another vote (rank 0 sleeps and sends no ticket: rank 1 would wait
// forever, and its wait_idle() with it).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <thread>

#include "engine/ep/paced_comm.h"
#include "ep/ep_test_model.h"
#include "kvfleet/communicator.h"

using namespace kvfleet;
using namespace std::chrono_literals;

namespace {

// Rank 0's end of the link: a ticket is a direct call of the worker's ticket(); its rings come from Rank1.
struct DirectTicketLink final : ep::TicketLink {
  ep::WorkerCommunicator* worker = nullptr;
  std::atomic<int> tickets{0};
  std::function<void()> rang;
  void send_vote() override {
    ++tickets;
    worker->ticket();
  }
  void on_ring(std::function<void()> handler) override { rang = std::move(handler); }
};

// Rank 1's communicator as its engine sees it: the worker's, counting the votes it enters; ring() reaches
// rank 0 directly.
class Rank1 final : public Communicator {
 public:
  Rank1(ep::WorkerCommunicator& w, DirectTicketLink& peer) : w_(w), peer_(peer) {}
  int rank() const override { return w_.rank(); }
  int size() const override { return w_.size(); }
  std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                         std::vector<std::size_t>& recv_bytes) override {
    return w_.all_to_all_v(send, send_bytes, recv_bytes);
  }
  void all_gather(const void* send, std::size_t bytes, void* recv) override {
    ++votes;
    w_.all_gather(send, bytes, recv);
  }
  void barrier() override { w_.barrier(); }
  bool can_ring() const override { return true; }
  void set_ring_handler(std::function<void()> handler) override { w_.set_ring_handler(std::move(handler)); }
  void ring() override {
    if (peer_.rang) peer_.rang();
  }
  bool vote_requested() const override { return w_.vote_requested(); }
  std::atomic<int> votes{0};

 private:
  ep::WorkerCommunicator& w_;
  DirectTicketLink& peer_;
};

}  // namespace

TEST_CASE("paced votes: a ticket for a vote rank 1 was already waiting in does not send it into another") {
  test::TempDir dir;
  const Model model = test::tiny_moe(dir);
  auto inner = make_in_process_group(2);
  ep::WorkerCommunicator worker(*inner[1]);
  ep::FrontCommunicator front(*inner[0], nullptr);
  DirectTicketLink peer;
  peer.worker = &worker;
  front.attach({&peer});
  Rank1 rank1(worker, peer);

  EngineConfig c1 = test::ep_config(64);
  c1.ep = &rank1;
  auto e1 = std::make_unique<Engine>(model, c1);
  // Rank 1's engine votes at once (a new group polls) and waits there for rank 0's first ticket. Rank 0 does
  // not exist yet, so the ticket (and its ring) can only come while rank 1 is inside the vote it is for:
  // the race is not left to timing.
  const auto until = [](const std::function<bool()>& done, std::chrono::milliseconds limit) {
    for (const auto end = std::chrono::steady_clock::now() + limit; !done();) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  };
  REQUIRE(until([&] { return rank1.votes > 0; }, 10s));
  REQUIRE(rank1.votes.load() == 1);
  EngineConfig c0 = test::ep_config(64);
  c0.ep = &front;
  auto e0 = std::make_unique<Engine>(model, c0);

  // Rank 0 votes, its ticket rings rank 1 (already in that vote), the group is idle and both sleep: rank 1
  // enters no vote that rank 0 has not sent a ticket for. Its engine counts as idle only while it sleeps
  // (it holds its lock from the end of one vote to the start of the next), so wait_idle() returns only
  // once rank 1 has decided against another vote; the old engine voted again at once and never slept.
  REQUIRE(until([&] { return peer.tickets > 0; }, 10s));
  auto idle = std::async(std::launch::async, [&] { e1->wait_idle(); });
  CHECK(idle.wait_for(10s) == std::future_status::ready);
  CHECK(rank1.votes.load() == peer.tickets.load());  // the old engine: one more, waiting for a ticket forever

  // The group still works: a request on rank 1 rings rank 0, both vote and step, the answer comes.
  std::promise<RequestOutput> done;
  std::vector<TokenId> tokens;
  GenerationRequest r;
  r.prompt = {5, 9, 2, 77, 31};
  r.max_tokens = 4;
  r.ignore_eos = true;
  e1->submit(r, [&](const RequestOutput& o) {
    tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    if (o.finished) done.set_value(o);
  });
  auto answer = done.get_future();
  REQUIRE(answer.wait_for(10s) == std::future_status::ready);
  CHECK(answer.get().error == "");
  CHECK(tokens.size() == 4);
  if (idle.wait_for(5s) == std::future_status::ready) {
    e1.reset();  // stops: rings rank 0, both vote "stopping" and leave
    e0.reset();
  } else {
    std::fflush(stdout);
    std::_Exit(1);  // rank 1's engine is stuck in a vote: nothing could join it
  }
}
