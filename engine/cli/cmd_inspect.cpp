// kvfleet inspect: what a model directory holds (config, tensors, dtypes, bytes).
#include <cstdio>

#include "engine/cli/common.h"
#include "kvfleet/model.h"

namespace kvfleet::cli {

void register_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("inspect", "Load a model directory, check it, and summarize it");
  cmd->add_option("--model", *dir, "Hugging Face model directory")->required();
  cmd->callback([dir] {
    const Model m = Model::load(*dir);
    const ModelConfig& c = m.config();
    std::printf("model:        %s (%s)\n", m.name().c_str(), c.model_type.c_str());
    std::printf("layers:       %lld, hidden %lld, intermediate %lld\n", static_cast<long long>(c.num_layers),
                static_cast<long long>(c.hidden_size), static_cast<long long>(c.intermediate_size));
    std::printf("heads:        %lld (kv %lld), head_dim %lld\n", static_cast<long long>(c.num_heads),
                static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim));
    std::printf("vocab:        %lld, tied embeddings: %s\n", static_cast<long long>(c.vocab_size),
                c.tie_word_embeddings ? "yes" : "no");
    std::printf("weights:      %s, %.1f MB\n", std::string(dtype_name(m.embed().dtype)).c_str(),
                static_cast<double>(m.weight_bytes()) / 1e6);
    std::printf("ok: every tensor present with the shape config.json implies\n");
  });
}

}  // namespace kvfleet::cli
