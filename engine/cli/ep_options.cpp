#include "engine/cli/ep_options.h"

#include "engine/ep/paced_rank.h"

namespace kvfleet::cli {

void add_ep_process_options(CLI::App& cmd, EpProcessOptions& o) {
  cmd.add_option("--ep-rank", o.rank, "MoE: this process is rank R of --ep-size processes (Gloo over TCP)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--ep-master", o.master, "With --ep-rank: HOST:PORT where rank 0 runs the rendezvous store");
  cmd.add_option("--ep-bind", o.bind, "With --ep-rank: this rank's address for the collectives (default: "
                                      "127.0.0.1 for a loopback master, else the host name's)");
  cmd.add_option("--ep-timeout-ms", o.timeout_ms, "With --ep-rank: a peer that does not answer a collective "
                                                  "(or join) within this fails the group")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--ep-comm", o.comm, "With --ep-rank: gloo (CPU collectives over TCP, host staging), nccl (GPU "
                                      "ranks, device memory) or auto (nccl for a CUDA rank when built with NCCL)")
      ->check(CLI::IsMember({"gloo", "nccl", "auto"}));
}

std::unique_ptr<Communicator> connect_ep_rank(int ep_size, const EpProcessOptions& o, BackendOptions& backend) {
  if (o.master.empty()) throw std::invalid_argument("--ep-rank needs --ep-master HOST:PORT");
  if (o.rank >= ep_size)
    throw std::invalid_argument("--ep-rank " + std::to_string(o.rank) + " must be below --ep-size " + std::to_string(ep_size));
  EpCommOptions c;
  c.kind = o.comm;
  c.rank = o.rank;
  c.size = ep_size;
  c.master = o.master;
  c.bind_host = o.bind;
  c.timeout = std::chrono::milliseconds(o.timeout_ms);
  return make_ep_communicator(c, backend);
}

std::unique_ptr<Communicator> connect_paced_ep_rank(int ep_size, const EpProcessOptions& o, BackendOptions& backend) {
  ep::PacedRankOptions p;
  p.master = o.master;
  p.bind_host = o.bind;
  p.timeout = std::chrono::milliseconds(o.timeout_ms);
  return ep::pace_process_rank(connect_ep_rank(ep_size, o, backend), p);
}

}  // namespace kvfleet::cli
