// Lockstep without polling for the bare process ranks of `kvfleet generate --ep-rank R` (no request
// channel: every rank reads the same prompts and runs its own). It is the replica's pacing
// (ep/paced_comm.h) over a channel (ep/channel.h) that carries only vote tickets and rings: once the
// group's communicator (Gloo or NCCL) has formed, rank r > 0 listens on a free port at its reachable
// address, publishes HOST:PORT in the rendezvous store under kvfleet/ep/channel/R, and rank 0 connects to
// each. Rank 0 sends every rank a ticket before each of its votes and rank r votes only holding one; news
// on rank r rings rank 0. An idle group sleeps, and a request reaches it in a channel hop or two.
// Failure: a channel that closes or stays silent for the timeout (a rank that exited or froze) shuts the
// paced communicator down, so that an engine asleep in an idle group wakes and fails with
// "expert-parallel rank R of N: rank Q is gone: ..." instead of sleeping forever; a rank that goes while
// the group steps fails the collective itself (Gloo's or NCCL's error).
// Thread-safety: as Communicator (one rank's engine thread); the channels run their own threads.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "kvfleet/communicator.h"

namespace kvfleet::ep {

struct PacedRankOptions {
  std::string master;     // the group's rendezvous store (HOST:PORT), served by rank 0's communicator
  std::string bind_host;  // this rank's address for its channel (as GlooOptions::bind_host)
  std::chrono::milliseconds timeout{30000};      // a silent channel fails the group after this
  std::chrono::milliseconds join_timeout{0};     // connecting the channels, when longer; 0: timeout
};

// Wraps a process rank's communicator (rank and size from it) so that its engine votes on rank 0's
// tickets. Blocks until the channels are up (std::runtime_error naming the rank that did not come).
std::unique_ptr<Communicator> pace_process_rank(std::unique_ptr<Communicator> inner, const PacedRankOptions& options);

}  // namespace kvfleet::ep
