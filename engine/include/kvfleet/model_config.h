// The parts of a Hugging Face config.json that the llama family (Llama 1/2/3, Qwen2/2.5, Mistral) and the
// mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) use.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kvfleet/block_hash.h"
#include "kvfleet/dtype.h"

namespace kvfleet {

struct RopeScaling {
  enum class Kind : std::uint8_t { none, linear, llama3 } kind = Kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;    // llama3
  double high_freq_factor = 4.0;   // llama3
  std::int64_t original_max_position_embeddings = 8192;  // llama3
};

// Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE). num_experts == 0: a dense model.
struct MoeConfig {
  std::int64_t num_experts = 0;          // mixtral: num_local_experts; qwen: num_experts
  std::int64_t top_k = 0;                // num_experts_per_tok
  std::int64_t expert_intermediate = 0;  // mixtral: intermediate_size; qwen: moe_intermediate_size
  std::int64_t shared_intermediate = 0;  // qwen2_moe: shared_expert_intermediate_size (0: no shared expert)
  bool norm_topk_prob = false;           // renormalise the top-k probabilities (Mixtral always does)
  std::int64_t decoder_sparse_step = 1;  // qwen: layer i is sparse when (i + 1) % step == 0 ...
  std::vector<std::int64_t> mlp_only_layers;  // ... and i is not listed here

  bool enabled() const { return num_experts > 0; }
  // Whether layer `layer` has the sparse MoE block (else the dense MLP of intermediate_size).
  bool is_sparse_layer(std::int64_t layer) const;
};

struct ModelConfig {
  std::string model_type;  // llama | qwen2 | mistral | mixtral | qwen2_moe | qwen3_moe
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // qwen2 always; llama's attention_bias
  bool o_bias = false;    // llama's attention_bias
  bool mlp_bias = false;
  bool qk_norm = false;   // qwen3_moe: RMSNorm over head_dim on every q and k head before RoPE
  MoeConfig moe;
  DType dtype = DType::f32;  // torch_dtype / dtype, informational (tensors carry their own)
  std::vector<TokenId> eos_token_ids;
  std::int32_t bos_token_id = -1;

  // Parses config.json (and generation_config.json's eos ids when present). Throws ModelError naming the
  // file and the key on a missing or bad value, or an unsupported architecture.
  static ModelConfig load(const std::filesystem::path& model_dir);
  static ModelConfig parse(const std::string& json_text, const std::string& source_name);
};

}  // namespace kvfleet
