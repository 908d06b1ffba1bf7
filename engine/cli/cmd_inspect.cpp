// kvfleet inspect: what a model directory holds (config, tensors, dtypes, bytes).
#include <algorithm>
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
    if (c.moe.enabled()) {
      const MoeConfig& e = c.moe;
      std::int64_t sparse = 0;
      for (std::int64_t i = 0; i < c.num_layers; ++i) sparse += e.is_sparse_layer(i) ? 1 : 0;
      const bool packed = std::any_of(m.layers().begin(), m.layers().end(), [](const LayerWeights& l) { return l.moe.packed; });
      std::printf("experts:      %lld, top-%lld, expert intermediate %lld, norm_topk_prob %s, %s layout\n",
                  static_cast<long long>(e.num_experts), static_cast<long long>(e.top_k),
                  static_cast<long long>(e.expert_intermediate), e.norm_topk_prob ? "yes" : "no",
                  packed ? "packed (experts.gate_up_proj)" : "per-expert (experts.N.*)");
      std::printf("sparse:       %lld of %lld layers (decoder_sparse_step %lld, %zu mlp-only)\n",
                  static_cast<long long>(sparse), static_cast<long long>(c.num_layers),
                  static_cast<long long>(e.decoder_sparse_step), e.mlp_only_layers.size());
      if (e.shared_intermediate > 0)
        std::printf("shared:       expert of intermediate %lld, sigmoid-gated\n", static_cast<long long>(e.shared_intermediate));
    }
    if (c.qk_norm) std::printf("attention:    RMSNorm on q and k per head\n");
    std::printf("weights:      %s, %.1f MB\n", std::string(dtype_name(m.embed().dtype)).c_str(),
                static_cast<double>(m.weight_bytes()) / 1e6);
    std::printf("ok: every tensor present with the shape config.json implies\n");
  });
}

}  // namespace kvfleet::cli
