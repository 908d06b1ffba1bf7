// kvfleet logits: the logits of every position of a token sequence, as JSON.
#include <cstdio>
#include <numeric>
#include <string>

#include "engine/cli/common.h"
#include "kvfleet/model_runner.h"

namespace kvfleet::cli {

void register_logits(CLI::App& app) {
  struct Args {
    std::string model, ids;
    BackendOptions backend;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("logits", "Print the logits of every position as JSON {\"logits\": [[...], ...]}");
  cmd->add_option("--model", a->model, "Hugging Face model directory")->required();
  cmd->add_option("--ids", a->ids, "Token ids, e.g. 1,2,3")->required();
  add_backend_options(*cmd, a->backend);
  cmd->callback([a] {
    const auto ids = parse_ids(a->ids);
    const Model model = Model::load(a->model);
    auto backend = make_backend(a->backend);
    RunnerOptions ro;
    ro.num_blocks = static_cast<std::int64_t>(ids.size()) / ro.block_size + 1;
    ro.max_batch_tokens = static_cast<std::int64_t>(ids.size());
    ModelRunner runner(model, *backend, ro);
    std::vector<std::int32_t> table(static_cast<std::size_t>(ro.num_blocks));
    std::iota(table.begin(), table.end(), 0);
    ForwardBatch batch;
    batch.chunks.push_back({ids, 0, table, SeqChunk::Logits::all});
    const auto logits = runner.forward(batch);
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
