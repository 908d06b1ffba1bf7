// Executes ForwardBatches on a backend: the llama-family forward pass (Llama 1/2/3, Qwen2, Mistral) and its
// mixture-of-experts variants (Mixtral, Qwen2-MoE, Qwen3-MoE).
// Thread-safety: one thread at a time (the engine thread owns the runner).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kvfleet/backend.h"
#include "kvfleet/forward_batch.h"
#include "kvfleet/model.h"

namespace kvfleet {

class Communicator;
class MoeLayers;

struct RunnerOptions {
  std::int64_t num_blocks = 256;
  std::int64_t block_size = 16;
  std::int64_t max_batch_tokens = 2048;  // scratch buffers are sized for this many tokens per step
  // Expert parallelism (MoE models): this rank's communicator; null = every expert on this runner. With
  // one, every rank must call forward() in lockstep, a rank without work with an empty batch.
  Communicator* ep = nullptr;
};

// Rotary inverse frequencies after rope scaling, as transformers computes them (fp32).
std::vector<float> rope_inv_freq(const ModelConfig& config);

// The logits of every position of one sequence, computed in one step on a fresh runner: what
// `kvfleet logits` prints and what the reference tests compare. [ids.size()][vocab_size].
std::vector<float> all_position_logits(const Model& model, Backend& backend, std::span<const TokenId> ids);

// The same on ep_size in-process expert-parallel ranks (threads, each with its own backend from `backend`,
// KV cache and num_experts / ep_size experts), every rank computing `ids`: rank 0's logits, which equal
// the single-rank ones bit for bit. What `kvfleet logits --ep-size N` prints.
std::vector<float> all_position_logits_ep(const Model& model, const BackendOptions& backend,
                                          std::span<const TokenId> ids, int ep_size);
// One rank of such a group, whatever its communicator (in process or Gloo across processes): what
// `kvfleet logits --ep-rank R --ep-master ADDR:PORT` runs; every rank returns the same logits.
std::vector<float> all_position_logits_rank(const Model& model, const BackendOptions& backend,
                                            std::span<const TokenId> ids, Communicator& comm);

class ModelRunner {
 public:
  ModelRunner(const Model& model, Backend& backend, const RunnerOptions& options);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs one step. Returns the logits the chunks ask for, in chunk order: one row per chunk with
  // Logits::last, every token's row for Logits::all; each row has vocab_size floats.
  std::vector<float> forward(const ForwardBatch& batch);
  // The same, in a host buffer the runner reuses from step to step (valid until the next call): the
  // engine's path, with no rows x vocab allocation per step.
  std::span<float> forward_view(const ForwardBatch& batch);

  const Model& model() const { return model_; }
  Backend& backend() { return backend_; }
  const RunnerOptions& options() const { return options_; }
  // MoE models: tokens routed to each expert by the last forward(), [num_layers][num_experts] (zeros for
  // dense layers of the model). Empty for a dense model.
  const std::vector<std::int32_t>& expert_tokens() const { return expert_tokens_; }
  // Expert parallelism: seconds spent in the MoE layers' dispatch and combine since construction.
  double ep_exchange_seconds() const;

 private:
  struct Weights;
  struct Scratch;
  void run_layer(std::int64_t layer, std::int64_t rows, const AttentionMeta& meta);
  void run_mlp(std::int64_t layer, std::int64_t rows);

  const Model& model_;
  Backend& backend_;
  RunnerOptions options_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<MoeLayers> moe_;
  std::vector<std::int32_t> expert_tokens_;
  std::vector<float> host_logits_;  // forward_view's buffer
};

}  // namespace kvfleet
