// kvfleet-replica: serves one model over the OpenAI API. `kvfleet-replica --model DIR --port N`, or
// `--config replica.yaml` with any setting also given as a flag (flags win). SIGTERM/SIGINT drain: new
// requests get 503 while running ones finish (up to --drain-timeout-ms), then the process exits.
#include <cstdio>
#include <exception>

#include "engine/server/ep_worker_main.h"
#include "engine/server/replica.h"
#include "kvfleet/backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kvfleet/http/shutdown.h"

int main(int argc, char** argv) {
  using namespace kvfleet::server;
  const sigset_t signals = kvfleet::http::block_shutdown_signals();  // before any thread starts
  try {
    std::string help;
    const ReplicaConfig config = parse_replica_args(argc, argv, &help);
    if (!help.empty()) {
      std::fputs(help.c_str(), stdout);
      return 0;
    }
    if (config.ep_processes() && config.ep_rank > 0) return run_ep_worker(config, signals);  // no HTTP
    std::fprintf(stderr, "kvfleet-replica: loading %s\n", config.model.c_str());
    Replica replica(config);
    replica.start();
    // The CPU kernels' instruction set is chosen once per process (kernels/cpu/cpu_isa.h): say which.
    const std::string backend(kvfleet::chosen_backend_kind(config.engine.backend));  // --backend auto: which
    const std::string kernels =
        backend == "cpu" ? ", kernels " + std::string(kvfleet::cpu::isa_name(kvfleet::cpu::cpu_isa())) : "";
    std::printf("kvfleet-replica: serving '%s' on http://%s:%u (backend %s%s)\n", replica.model_name().c_str(),
                config.host.c_str(), replica.port(), backend.c_str(), kernels.c_str());
    std::fflush(stdout);
    kvfleet::http::wait_then_drain("kvfleet-replica", signals, [&] { return replica.drain(); });
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvfleet-replica: error: %s\n", e.what());
    return 1;
  }
}
