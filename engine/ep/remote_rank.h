// RemoteRank: rank 0's view of rank r > 0 of an expert-parallel group of processes, behind the request
// channel (ep/channel.h). submit() waits for the rank's ack (at most the timeout), so a request that
// rank can never run is refused there and then with its own engine's message (std::invalid_argument),
// exactly as a local engine refuses it. Outputs arrive on the channel's reader thread; the rank's KV
// events are published into a local ring (the rank's events, in its order), its stats cached.
#pragma once

#include <chrono>
#include <future>
#include <mutex>
#include <unordered_map>

#include "engine/ep/channel.h"
#include "engine/ep/paced_comm.h"
#include "kvfleet/ep_group.h"

namespace kvfleet::ep {

inline std::string channel_key(int rank) { return "kvfleet/ep/channel/" + std::to_string(rank); }

class RemoteRank final : public EpRank, public TicketLink {
 public:
  // `fd`: connected to rank `rank`'s channel. `ring`: where its KV events go (block size and root as
  // rank 0's own). Starts the channel.
  RemoteRank(int rank, int size, int fd, std::shared_ptr<KvEventRing> ring, std::chrono::milliseconds timeout);
  ~RemoteRank() override;

  RequestId submit(GenerationRequest request, OutputCallback on_output) override;
  void abort(RequestId id) override;
  void abort_all(const std::string& error) override;
  EngineStats stats() const override;
  std::shared_ptr<KvEventRing> kv_events() const override { return ring_; }
  void on_failure(std::function<void(const std::string&)> handler) override;
  void kv_state(std::function<void(boost::json::object)> done) override;  // a `query` over the channel
  void stats_now(std::function<void(EngineStats)> done) override;         // the same
  bool in_process() const override { return false; }
  // Lockstep without polling (ep/paced_comm.h): rank 0 sends a vote ticket before each of its votes;
  // `handler` runs (reader thread) when this rank rings, i.e. has news for the group.
  void send_vote() override { channel_->send(Message{{"t", "vote"}}); }
  void on_ring(std::function<void()> handler) override;

 private:
  struct Ack {
    bool ok = false, invalid = false;
    std::string error;
  };
  void on_message(Message& m);
  void on_closed(const std::string& why);
  // Sends {t: query, id, what}; `done` gets the answer, or {"error": why} once the rank is gone.
  void query(const std::string& what, std::function<void(boost::json::object)> done);

  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<KvEventRing> ring_;
  mutable std::mutex mu_;
  std::unordered_map<RequestId, OutputCallback> callbacks_;
  std::unordered_map<RequestId, std::promise<Ack>> acks_;
  std::unordered_map<std::uint64_t, std::function<void(boost::json::object)>> queries_;  // by query id
  std::uint64_t next_query_ = 1;
  EngineStats stats_;
  std::string failure_;
  std::function<void(const std::string&)> on_failure_;
  std::function<void()> on_ring_;
  RequestId next_id_ = 1;
  std::unique_ptr<Channel> channel_;  // last: its threads stop before the rest goes
};

}  // namespace kvfleet::ep
