#include "engine/cli/ep_options.h"

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
}

std::unique_ptr<Communicator> connect_ep_rank(int ep_size, const EpProcessOptions& o) {
  if (o.master.empty()) throw std::invalid_argument("--ep-rank needs --ep-master HOST:PORT");
  if (o.rank >= ep_size)
    throw std::invalid_argument("--ep-rank " + std::to_string(o.rank) + " must be below --ep-size " + std::to_string(ep_size));
  GlooOptions g;
  g.rank = o.rank;
  g.size = ep_size;
  g.master = o.master;
  g.bind_host = o.bind;
  g.timeout = std::chrono::milliseconds(o.timeout_ms);
  return make_gloo_communicator(g);
}

}  // namespace kvfleet::cli
