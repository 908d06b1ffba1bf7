// A worker rank's process (ep_worker_main.h): loads the model and tokenizer, joins the group, serves rank 0
// until it goes or a signal comes.
#include "engine/server/ep_worker_main.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <thread>

#include "kvfleet/ep_worker.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet::server {

int run_ep_worker(const ReplicaConfig& config, const sigset_t& signals) {
  if (config.role != "mixed") throw std::invalid_argument("--ep-size needs role mixed (KV transfer serves one engine)");
  const Model model = Model::load(config.model);
  if (!model.config().moe.enabled()) throw std::invalid_argument("--ep-size needs a mixture-of-experts model");
  const Tokenizer tokenizer = Tokenizer::load(config.model);
  EngineConfig engine = config.engine;
  engine.served_model_name = config.served_model_name.empty() ? model.name() : config.served_model_name;
  std::fprintf(stderr, "kvfleet-replica: expert-parallel rank %d of %d: joining %s\n", config.ep_rank, config.ep_size,
               config.ep_master.c_str());
  auto worker_ptr = std::make_unique<EpWorker>(model, &tokenizer, engine, ep_comm_options(config));
  EpWorker& worker = *worker_ptr;
  // Ending the worker joins its engine, which may sit in a collective with a peer that is gone: it fails
  // within the timeout, but nothing here may keep the process from exiting, so a watchdog ends it.
  const auto leave = [&](int status) {
    std::thread([status, limit = config.ep_timeout + std::chrono::seconds(2)] {
      std::this_thread::sleep_for(limit);
      std::fprintf(stderr, "kvfleet-replica: the rank did not stop in time; exiting anyway\n");
      std::_Exit(status);
    }).detach();
    worker_ptr.reset();
    return status;
  };
  std::printf("kvfleet-replica: expert-parallel rank %d of %d serving rank 0 (no HTTP)\n", config.ep_rank, config.ep_size);
  std::fflush(stdout);
  const timespec tick{0, 100'000'000};
  for (;;) {
    if (sigtimedwait(&signals, nullptr, &tick) > 0) {
      std::fprintf(stderr, "kvfleet-replica: rank %d: signal, stopping\n", config.ep_rank);
      return leave(0);
    }
    if (worker.wait(std::chrono::milliseconds(0))) {
      std::fprintf(stderr, "kvfleet-replica: rank %d: %s; exiting\n", config.ep_rank, worker.why().c_str());
      return leave(1);
    }
  }
}

}  // namespace kvfleet::server
