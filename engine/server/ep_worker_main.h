// kvfleet-replica --ep-rank R with R > 0: one expert-parallel rank in this process and no public HTTP
// (kvfleet/ep_worker.h). Returns the process's exit status: 0 after SIGTERM/SIGINT, 1 when rank 0 went
// away or the group could not form (the message says which).
#pragma once

#include <csignal>

#include "engine/server/replica_config.h"

namespace kvfleet::server {

int run_ep_worker(const ReplicaConfig& config, const sigset_t& signals);

}  // namespace kvfleet::server
