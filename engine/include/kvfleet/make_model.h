// Writes a tiny model with random weights in exactly the Hugging Face format (config.json,
// model.safetensors or shards with an index, and tokenizer files copied from a real tokenizer).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "kvfleet/dtype.h"

namespace kvfleet {

struct MakeModelOptions {
  std::string arch = "llama";  // llama | qwen2 | mistral
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
};

void make_model(const MakeModelOptions& options, const std::filesystem::path& out_dir);

}  // namespace kvfleet
