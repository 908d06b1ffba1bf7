// A loaded Hugging Face model directory: config plus views of every weight in the mapped checkpoint.
// Weights stay in the checkpoint's dtype; nothing is copied.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "kvfleet/model_config.h"
#include "kvfleet/safetensors.h"

namespace kvfleet {

// One expert's SwiGLU MLP: down(silu(gate(x)) * up(x)). Views into the mapped checkpoint: whole tensors
// in the per-expert layout (experts.N.w1/w3/w2, experts.N.gate_proj/up_proj/down_proj), slices of the
// packed tensors otherwise (experts.gate_up_proj [E, 2I, H]: gate rows first; experts.down_proj [E, H, I]).
struct ExpertWeights {
  TensorView gate, up, down;  // [I, H], [I, H], [H, I]
};

// The sparse MoE block of one layer (empty `experts`: the layer has the dense MLP).
struct MoeLayerWeights {
  const TensorView* router = nullptr;  // [E, H]
  std::vector<ExpertWeights> experts;
  bool packed = false;  // which checkpoint layout the experts came from
  // qwen2_moe: out += sigmoid(shared_expert_gate(x)) * shared_expert(x)
  const TensorView* shared_gate = nullptr;
  const TensorView* shared_up = nullptr;
  const TensorView* shared_down = nullptr;
  const TensorView* shared_expert_gate = nullptr;  // [1, H]
};

struct LayerWeights {
  const TensorView* input_norm = nullptr;
  const TensorView* q = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  const TensorView* o = nullptr;
  const TensorView* q_bias = nullptr;  // optional ones are null when absent
  const TensorView* k_bias = nullptr;
  const TensorView* v_bias = nullptr;
  const TensorView* o_bias = nullptr;
  const TensorView* post_norm = nullptr;
  const TensorView* gate = nullptr;
  const TensorView* up = nullptr;
  const TensorView* down = nullptr;
  const TensorView* gate_bias = nullptr;
  const TensorView* up_bias = nullptr;
  const TensorView* down_bias = nullptr;
  const TensorView* q_norm = nullptr;  // qwen3_moe: [head_dim]
  const TensorView* k_norm = nullptr;
  MoeLayerWeights moe;  // sparse layers only; gate/up/down above are null there
};

class Model {
 public:
  // Loads config.json and the checkpoint, and checks every tensor the architecture needs is present with
  // the shape config.json implies. Throws ModelError naming the file and tensor otherwise.
  static Model load(const std::filesystem::path& dir);

  const ModelConfig& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  // The served model name by default: the directory's base name.
  std::string name() const;

  const TensorView& embed() const { return *embed_; }
  const TensorView& final_norm() const { return *final_norm_; }
  const TensorView& lm_head() const { return *lm_head_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  std::size_t weight_bytes() const { return checkpoint_.total_bytes(); }

 private:
  std::filesystem::path dir_;
  ModelConfig config_;
  Checkpoint checkpoint_;
  const TensorView* embed_ = nullptr;
  const TensorView* final_norm_ = nullptr;
  const TensorView* lm_head_ = nullptr;
  std::vector<LayerWeights> layers_;
};

}  // namespace kvfleet
