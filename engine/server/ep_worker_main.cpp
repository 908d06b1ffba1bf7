// A worker rank's process (ep_worker_main.h): loads the model and tokenizer, joins the group, serves rank 0
// until it goes or a signal comes.
#include "engine/server/ep_worker_main.h"

#include <cstdio>
#include <ctime>

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
  EpWorker worker(model, &tokenizer, engine, ep_gloo_options(config));
  std::printf("kvfleet-replica: expert-parallel rank %d of %d serving rank 0 (no HTTP)\n", config.ep_rank, config.ep_size);
  std::fflush(stdout);
  const timespec tick{0, 100'000'000};
  for (;;) {
    if (sigtimedwait(&signals, nullptr, &tick) > 0) {
      std::fprintf(stderr, "kvfleet-replica: rank %d: signal, stopping\n", config.ep_rank);
      return 0;
    }
    if (worker.wait(std::chrono::milliseconds(0))) {
      std::fprintf(stderr, "kvfleet-replica: rank %d: %s; exiting\n", config.ep_rank, worker.why().c_str());
      return 1;
    }
  }
}

}  // namespace kvfleet::server
