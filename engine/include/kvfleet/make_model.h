// Writes a tiny model with random weights in exactly the Hugging Face format (config.json,
// model.safetensors or shards with an index, and tokenizer files copied from a real tokenizer).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kvfleet/dtype.h"

namespace kvfleet {

struct MakeModelOptions {
  std::string arch = "llama";  // llama | qwen2 | mistral | mixtral | qwen2_moe | qwen3_moe
  std::int64_t layers = 2, hidden = 64, intermediate = 128, heads = 4, kv_heads = 2;
  std::int64_t head_dim = 0;  // 0: hidden / heads (and no head_dim key in config.json)
  std::int64_t vocab = 512;   // raised to the tokenizer's size when one is copied
  std::int64_t max_position = 4096;
  double rope_theta = 10000.0;
  std::string rope_scaling = "none";  // none | linear | llama3
  double rope_factor = 8.0;
  bool tie_embeddings = false;
  bool attention_bias = false;  // llama only; qwen2 always has q/k/v bias
  DType dtype = DType::f32;
  std::uint64_t seed = 0;
  int shards = 1;  // > 1 writes model-0000i-of-0000n.safetensors and model.safetensors.index.json
  std::filesystem::path tokenizer;  // tokenizer.json or a directory holding it; empty: none

  // Mixture of experts (mixtral, qwen2_moe, qwen3_moe). Mixtral's experts use `intermediate`; Qwen's use
  // moe_intermediate, and their dense layers (mlp_only_layers, decoder_sparse_step) use `intermediate`.
  std::int64_t experts = 8, experts_per_tok = 2;
  std::int64_t moe_intermediate = 32;
  std::int64_t shared_intermediate = 48;  // qwen2_moe's shared expert
  bool norm_topk_prob = true;             // qwen only (Mixtral always renormalises)
  std::int64_t decoder_sparse_step = 1;
  std::vector<std::int64_t> mlp_only_layers;
  // false: experts.N.* tensors (w1/w3/w2 for Mixtral, gate/up/down_proj for Qwen); true: transformers 5's
  // packed mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I]. The same seed gives
  // the same weights in both layouts.
  bool packed_experts = false;
};

bool is_moe_arch(const std::string& arch);

void make_model(const MakeModelOptions& options, const std::filesystem::path& out_dir);

}  // namespace kvfleet
