// The sparse MoE blocks of a model, run on a backend for the model runner (internal to engine/runtime):
// router GEMM -> softmax/top-k -> experts grouped by token -> weighted combine, plus Qwen2-MoE's gated
// shared expert. Also counts the tokens each expert received in the current step.
// Thread-safety: one thread at a time (the engine thread, through ModelRunner).
#pragma once

#include <cstdint>
#include <vector>

#include "kvfleet/backend.h"
#include "kvfleet/model.h"

namespace kvfleet {

class MoeLayers {
 public:
  // Uploads every sparse layer's weights and sizes scratch for max_rows rows. Nothing for a dense model.
  MoeLayers(const Model& model, Backend& backend, std::int64_t max_rows);
  ~MoeLayers();
  MoeLayers(const MoeLayers&) = delete;
  MoeLayers& operator=(const MoeLayers&) = delete;

  bool sparse(std::int64_t layer) const;
  // Zeroes the step's expert token counts.
  void begin_step();
  // d_out[rows][hidden] = the MoE block of `layer` applied to d_x (post-attention-norm hidden states).
  void forward(std::int64_t layer, const float* d_x, std::int64_t rows, float* d_out);
  // Tokens routed to each expert in the step since begin_step, [num_layers][num_experts] (0 for dense
  // layers); empty for a dense model.
  std::vector<std::int32_t> step_counts();

 private:
  struct Layer {
    DeviceWeight router, shared_gate, shared_up, shared_down, shared_expert_gate;
    std::vector<DeviceWeight> gate, up, down;
  };
  Backend& backend_;
  const ModelConfig& config_;
  std::vector<Layer> layers_;  // one per model layer; sparse ones have experts
  float *logits_ = nullptr, *weights_ = nullptr, *shared_g_ = nullptr, *shared_u_ = nullptr, *shared_out_ = nullptr,
        *gate_logit_ = nullptr;
  std::int32_t *ids_ = nullptr, *counts_ = nullptr;
  std::vector<void*> owned_;
};

}  // namespace kvfleet
