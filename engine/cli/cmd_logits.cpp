// kvfleet logits: the logits of every position of a token sequence, as JSON.
#include <cstdio>
#include <string>

#include "engine/cli/common.h"
#include "engine/cli/ep_options.h"
#include "kvfleet/model_runner.h"

namespace kvfleet::cli {

void register_logits(CLI::App& app) {
  struct Args {
    std::string model, ids;
    BackendOptions backend;
    int ep_size = 1;
    EpProcessOptions ep;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("logits", "Print the logits of every position as JSON {\"logits\": [[...], ...]}");
  cmd->add_option("--model", a->model, "Hugging Face model directory")->required();
  cmd->add_option("--ids", a->ids, "Token ids, e.g. 1,2,3")->required();
  add_backend_options(*cmd, a->backend);
  cmd->add_option("--ep-size", a->ep_size, "MoE: expert-parallel ranks in process (each computes the sequence)")
      ->check(CLI::PositiveNumber);
  add_ep_process_options(*cmd, a->ep);
  cmd->callback([a] {
    const auto ids = parse_ids(a->ids);
    const Model model = Model::load(a->model);
    std::vector<float> logits;
    if (a->ep.over_processes()) {  // one rank per process: every rank computes, rank 0 prints
      if (!model.config().moe.enabled()) throw std::invalid_argument("--ep-rank needs a mixture-of-experts model");
      const auto comm = connect_ep_rank(a->ep_size, a->ep, a->backend);
      logits = all_position_logits_rank(model, a->backend, ids, *comm);
      comm->barrier();  // rank 0 keeps the rendezvous up until every rank is done
      if (a->ep.rank != 0) return;
    } else if (a->ep_size > 1) {
      if (!model.config().moe.enabled()) throw std::invalid_argument("--ep-size needs a mixture-of-experts model");
      logits = all_position_logits_ep(model, a->backend, ids, a->ep_size);
    } else {
      auto backend = make_backend(a->backend);
      logits = all_position_logits(model, *backend, ids);
    }
    const auto vocab = static_cast<std::size_t>(model.config().vocab_size);
    std::string out = "{\"logits\": [";
    char buf[32];
    for (std::size_t r = 0; r < ids.size(); ++r) {
      out += r ? ",\n[" : "\n[";
      for (std::size_t v = 0; v < vocab; ++v) {
        std::snprintf(buf, sizeof buf, "%s%.9g", v ? "," : "", static_cast<double>(logits[r * vocab + v]));
        out += buf;
      }
      out += ']';
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
  });
}

}  // namespace kvfleet::cli
