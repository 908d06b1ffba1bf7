// EpWorker: rank r > 0 of an expert-parallel group of processes (`kvfleet-replica --ep-size N --ep-rank R
// --ep-master HOST:PORT`, R > 0): its own engine (its share of the experts, its own scheduler and KV
// cache) and no public HTTP. It listens for rank 0's request channel (engine/ep/channel.h) on
// --ep-bind (any free port), joins the group (Gloo or NCCL: --ep-comm), publishes "kvfleet/ep/channel/R" = "HOST:PORT" in
// the rendezvous store and waits for rank 0 to connect; from then on it runs what rank 0 submits and
// sends back acks, outputs, its KV events and its stats. Rank 0 exiting (the channel closes) or going
// silent for the timeout ends run().
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "kvfleet/communicator.h"
#include "kvfleet/engine.h"

namespace kvfleet {

class EpWorker {
 public:
  // Blocks until rank 0 connected (throws std::runtime_error / CommunicatorError after comm's join
  // timeout). The communicator is Gloo or NCCL, as resolve_ep_comm(comm) says (an NCCL rank's engine
  // computes on the communicator's GPU).
  EpWorker(const Model& model, const Tokenizer* tokenizer, const EngineConfig& config, const EpCommOptions& comm);
  ~EpWorker();
  EpWorker(const EpWorker&) = delete;
  EpWorker& operator=(const EpWorker&) = delete;

  // Waits up to `timeout` for the end (rank 0 gone, or stop()); true when it ended. why() says why.
  bool wait(std::chrono::milliseconds timeout);
  std::string why() const;
  void stop(const std::string& why);  // any thread

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvfleet
