// The sparse MoE blocks of a model, run on a backend for the model runner (internal to engine/runtime):
// router GEMM -> softmax/top-k -> experts grouped by token -> weighted combine, plus Qwen2-MoE's gated
// shared expert. Also counts the tokens each expert received in the current step.
//
// Expert parallelism (a communicator of size > 1): this rank holds experts [rank * E / size, (rank + 1) *
// E / size) and its own rows; in every sparse layer each rank routes its rows, sends each (row, expert)
// pair to the expert's owner (all_to_all_v), runs its experts over what it received, sends the outputs
// back, and combines them with cpu::moe_combine in top-k rank order: the single-rank path's arithmetic,
// so the result does not depend on ep_size. Host staging (to_host/to_device) around the exchanges, but
// with a communicator that takes device memory (Communicator::device_memory(): NCCL), where the hidden
// states stay on the device (moe_expert_parallel_device.cpp) and only the routing ids come to the host.
// Thread-safety: one thread at a time (the engine thread, through ModelRunner).
#pragma once

#include <cstdint>
#include <vector>

#include "kvfleet/backend.h"
#include "kvfleet/communicator.h"
#include "kvfleet/model.h"

namespace kvfleet {

class MoeLayers {
 public:
  // Uploads every sparse layer's weights and sizes scratch for max_rows rows. Nothing for a dense model.
  // ep: this rank's communicator for expert parallelism (null or size 1: every expert here).
  MoeLayers(const Model& model, Backend& backend, std::int64_t max_rows, Communicator* ep = nullptr);
  ~MoeLayers();
  MoeLayers(const MoeLayers&) = delete;
  MoeLayers& operator=(const MoeLayers&) = delete;

  bool sparse(std::int64_t layer) const;
  // Zeroes the step's expert token counts.
  void begin_step();
  // d_out[rows][hidden] = the MoE block of `layer` applied to d_x (post-attention-norm hidden states).
  void forward(std::int64_t layer, const float* d_x, std::int64_t rows, float* d_out);
  bool expert_parallel() const { return ep_ != nullptr && ep_->size() > 1; }
  // Expert parallelism: a step with no rows here still takes part in every sparse layer's exchanges.
  void idle_step();
  // Tokens routed to each expert in the step since begin_step, [num_layers][num_experts] (0 for dense
  // layers); empty for a dense model.
  std::vector<std::int32_t> step_counts();
  // Expert parallelism: seconds spent in dispatch and combine (packing, the two exchanges, unpacking, the
  // combine; not the experts' compute), summed since construction.
  double exchange_seconds() const { return exchange_seconds_; }

 private:
  struct Layer {
    DeviceWeight router, shared_gate, shared_up, shared_down, shared_expert_gate;
    std::vector<DeviceWeight> gate, up, down;
  };
  void forward_ep(std::int64_t layer, const float* d_x, std::int64_t rows, float* d_out);
  void forward_ep_device(std::int64_t layer, const float* d_x, std::int64_t rows, float* d_out);
  void experts_here(std::int64_t layer, const std::vector<float>& x, const std::vector<std::int32_t>& ids,
                    std::vector<float>& y);
  void* staging(std::size_t which, std::size_t bytes);  // device buffer `which`, grown to `bytes`

  Backend& backend_;
  const ModelConfig& config_;
  Communicator* ep_ = nullptr;
  std::int64_t first_expert_ = 0, local_experts_ = 0;
  // device staging for expert parallelism: x, ids, ones, y (+ the device path's plan, send rows, replies)
  void* ep_buf_[7] = {};
  std::size_t ep_cap_[7] = {};
  double exchange_seconds_ = 0.0;
  std::vector<Layer> layers_;  // one per model layer; sparse ones have experts
  float *logits_ = nullptr, *weights_ = nullptr, *shared_g_ = nullptr, *shared_u_ = nullptr, *shared_out_ = nullptr,
        *gate_logit_ = nullptr;
  std::int32_t *ids_ = nullptr, *counts_ = nullptr;
  std::vector<void*> owned_;
};

}  // namespace kvfleet
