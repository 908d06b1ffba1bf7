// kvfleet make-model: a tiny random-weight model in the Hugging Face format.
#include <cstdio>

#include "engine/cli/common.h"
#include "kvfleet/make_model.h"

namespace kvfleet::cli {

void register_make_model(CLI::App& app) {
  auto o = std::make_shared<MakeModelOptions>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("float32");
  auto* cmd = app.add_subcommand("make-model", "Write a tiny random-weight model in the Hugging Face format");
  cmd->add_option("--out", *out, "Output directory")->required();
  cmd->add_option("--arch", o->arch, "llama, qwen2, mistral, mixtral, qwen2_moe or qwen3_moe")
      ->check(CLI::IsMember({"llama", "qwen2", "mistral", "mixtral", "qwen2_moe", "qwen3_moe"}));
  cmd->add_option("--layers", o->layers)->check(CLI::PositiveNumber);
  cmd->add_option("--hidden", o->hidden)->check(CLI::PositiveNumber);
  cmd->add_option("--intermediate", o->intermediate)->check(CLI::PositiveNumber);
  cmd->add_option("--heads", o->heads)->check(CLI::PositiveNumber);
  cmd->add_option("--kv-heads", o->kv_heads)->check(CLI::PositiveNumber);
  cmd->add_option("--head-dim", o->head_dim, "0: hidden / heads");
  cmd->add_option("--vocab", o->vocab, "Raised to the tokenizer's size when --tokenizer is given");
  cmd->add_option("--max-position", o->max_position);
  cmd->add_option("--rope-theta", o->rope_theta);
  cmd->add_option("--rope-scaling", o->rope_scaling)->check(CLI::IsMember({"none", "linear", "llama3"}));
  cmd->add_option("--rope-factor", o->rope_factor);
  cmd->add_flag("--tie", o->tie_embeddings, "Tie lm_head to the embeddings");
  cmd->add_flag("--attention-bias", o->attention_bias, "llama: biases on q/k/v/o");
  cmd->add_option("--dtype", *dtype)->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  cmd->add_option("--seed", o->seed);
  cmd->add_option("--shards", o->shards, "Write this many safetensors shards plus an index");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json or a directory with tokenizer files to copy");
  cmd->add_option("--experts", o->experts, "MoE: number of experts")->check(CLI::PositiveNumber);
  cmd->add_option("--experts-per-tok", o->experts_per_tok, "MoE: experts per token (top-k)")->check(CLI::PositiveNumber);
  cmd->add_option("--moe-intermediate", o->moe_intermediate, "qwen2_moe/qwen3_moe: expert intermediate size (mixtral: --intermediate)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--shared-intermediate", o->shared_intermediate, "qwen2_moe: shared expert size (0: none)");
  cmd->add_option("--norm-topk-prob", o->norm_topk_prob, "qwen MoE: renormalise the top-k probabilities");
  cmd->add_option("--decoder-sparse-step", o->decoder_sparse_step, "qwen MoE: every Nth layer is sparse")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--mlp-only-layers", o->mlp_only_layers, "qwen MoE: layers with a dense MLP")->delimiter(',');
  cmd->add_flag("--packed-experts", o->packed_experts,
                "MoE: transformers 5's packed mlp.experts.gate_up_proj/down_proj instead of experts.N.*");
  cmd->callback([cmd, o, out, dtype] {
    // Qwen's MoE knobs have no Mixtral (or dense) counterpart in config.json: one given for another
    // architecture would be silently dropped, so it is refused. Mixtral's expert size is --intermediate.
    const bool qwen_moe = o->arch == "qwen2_moe" || o->arch == "qwen3_moe";
    for (const char* flag : {"--moe-intermediate", "--shared-intermediate", "--norm-topk-prob", "--decoder-sparse-step",
                             "--mlp-only-layers"}) {
      if (qwen_moe || cmd->count(flag) == 0) continue;
      const std::string hint = o->arch == "mixtral" && std::string(flag) == "--moe-intermediate"
                                   ? " (Mixtral's experts are --intermediate wide: config.json's intermediate_size)"
                                   : "";
      throw CLI::ValidationError(flag, std::string("applies to --arch qwen2_moe and qwen3_moe only, not ") + o->arch + hint);
    }
    o->dtype = *dtype == "bfloat16" ? DType::bf16 : *dtype == "float16" ? DType::f16 : DType::f32;
    make_model(*o, *out);
    std::printf("wrote %s model to %s\n", o->arch.c_str(), out->c_str());
  });
}

}  // namespace kvfleet::cli
