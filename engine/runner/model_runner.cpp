#include "kvfleet/model_runner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "engine/runner/moe_layers.h"

namespace kvfleet {

struct ModelRunner::Weights {
  struct Layer {
    DeviceWeight input_norm, q, k, v, o, q_bias, k_bias, v_bias, o_bias;
    DeviceWeight post_norm, gate, up, down, gate_bias, up_bias, down_bias;
    DeviceWeight q_norm, k_norm;
  };
  DeviceWeight embed, final_norm, lm_head;
  std::vector<Layer> layers;
  float* inv_freq = nullptr;
};

// Device buffers for one step, sized for max_batch_tokens rows.
struct ModelRunner::Scratch {
  float *x = nullptr, *residual = nullptr, *h = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr;
  float *gate = nullptr, *up = nullptr, *logits_in = nullptr, *logits = nullptr;
  float *qn = nullptr, *kn = nullptr;  // q/k after the per-head RMSNorm (qwen3_moe)
  std::int32_t *ids = nullptr, *logit_rows = nullptr, *positions = nullptr, *table_offsets = nullptr, *tables = nullptr;
  std::int64_t* slots = nullptr;
  std::int64_t tables_capacity = 0;
  std::vector<void*> owned;
  // The host side of a step's metadata, reused from step to step (cleared, never shrunk).
  std::vector<std::int32_t> h_ids, h_positions, h_table_offsets, h_tables, h_logit_rows;
  std::vector<std::int64_t> h_slots;
};

namespace {

DeviceWeight upload(Backend& b, const TensorView* t) { return t ? b.upload_weight(*t) : DeviceWeight{}; }

}  // namespace

ModelRunner::ModelRunner(const Model& model, Backend& backend, const RunnerOptions& options)
    : model_(model), backend_(backend), options_(options), weights_(std::make_unique<Weights>()),
      scratch_(std::make_unique<Scratch>()) {
  const ModelConfig& c = model.config();
  Weights& w = *weights_;
  w.embed = upload(backend, &model.embed());
  w.final_norm = upload(backend, &model.final_norm());
  w.lm_head = upload(backend, &model.lm_head());
  for (const LayerWeights& l : model.layers()) {
    w.layers.push_back({upload(backend, l.input_norm), upload(backend, l.q), upload(backend, l.k),
                        upload(backend, l.v), upload(backend, l.o), upload(backend, l.q_bias),
                        upload(backend, l.k_bias), upload(backend, l.v_bias), upload(backend, l.o_bias),
                        upload(backend, l.post_norm), upload(backend, l.gate), upload(backend, l.up),
                        upload(backend, l.down), upload(backend, l.gate_bias), upload(backend, l.up_bias),
                        upload(backend, l.down_bias), upload(backend, l.q_norm), upload(backend, l.k_norm)});
  }
  backend.allocate_kv_cache({c.num_layers, options.num_blocks, options.block_size, c.num_kv_heads, c.head_dim});

  Scratch& s = *scratch_;
  auto alloc = [&](std::size_t bytes) {
    void* p = backend.allocate(bytes);
    s.owned.push_back(p);
    return p;
  };
  // A constructor that throws runs no destructor: free what was allocated (an expert-parallel split that
  // does not work out throws from MoeLayers, after the buffers; found by LeakSanitizer).
  try {
    const auto t = static_cast<std::size_t>(options.max_batch_tokens);
    const auto f = sizeof(float);
    const auto h = static_cast<std::size_t>(c.hidden_size), qd = static_cast<std::size_t>(c.num_heads * c.head_dim);
    const auto kvd = static_cast<std::size_t>(c.num_kv_heads * c.head_dim);
    const auto ff = static_cast<std::size_t>(c.intermediate_size);
    s.x = static_cast<float*>(alloc(t * h * f));
    s.residual = static_cast<float*>(alloc(t * h * f));
    s.h = static_cast<float*>(alloc(t * h * f));
    s.q = static_cast<float*>(alloc(t * qd * f));
    s.k = static_cast<float*>(alloc(t * kvd * f));
    s.v = static_cast<float*>(alloc(t * kvd * f));
    s.attn = static_cast<float*>(alloc(t * qd * f));
    s.gate = static_cast<float*>(alloc(t * ff * f));
    s.up = static_cast<float*>(alloc(t * ff * f));
    if (c.qk_norm) {
      s.qn = static_cast<float*>(alloc(t * qd * f));
      s.kn = static_cast<float*>(alloc(t * kvd * f));
    }
    s.logits_in = static_cast<float*>(alloc(t * h * f));
    s.logits = static_cast<float*>(alloc(t * static_cast<std::size_t>(c.vocab_size) * f));
    s.ids = static_cast<std::int32_t*>(alloc(t * sizeof(std::int32_t)));
    s.positions = static_cast<std::int32_t*>(alloc(t * sizeof(std::int32_t)));
    s.table_offsets = static_cast<std::int32_t*>(alloc(t * sizeof(std::int32_t)));
    s.logit_rows = static_cast<std::int32_t*>(alloc(t * sizeof(std::int32_t)));
    s.slots = static_cast<std::int64_t*>(alloc(t * sizeof(std::int64_t)));
    const auto inv = rope_inv_freq(c);
    w.inv_freq = static_cast<float*>(alloc(inv.size() * f));
    backend.to_device(w.inv_freq, inv.data(), inv.size() * f);
    moe_ = std::make_unique<MoeLayers>(model, backend, options.max_batch_tokens, options.ep);
  } catch (...) {
    for (void* p : s.owned) backend.deallocate(p);
    throw;
  }
}

ModelRunner::~ModelRunner() {
  for (void* p : scratch_->owned) backend_.deallocate(p);
  if (scratch_->tables) backend_.deallocate(scratch_->tables);
}

void ModelRunner::run_layer(std::int64_t li, std::int64_t rows, const AttentionMeta& meta) {
  const ModelConfig& c = model_.config();
  const Weights::Layer& l = weights_->layers[static_cast<std::size_t>(li)];
  Scratch& s = *scratch_;
  const std::int64_t h = c.hidden_size, qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  // Attention block. The residual stream starts as the embeddings; s.x holds the previous block's output.
  if (li == 0) {
    backend_.rms_norm(s.residual, rows, h, l.input_norm, eps, s.h);
  } else {
    backend_.add_rms_norm(s.residual, s.x, rows, h, l.input_norm, eps, s.h);
  }
  const Backend::LinearOut qkv[] = {{l.q, qd, l.q_bias, s.q}, {l.k, kvd, l.k_bias, s.k}, {l.v, kvd, l.v_bias, s.v}};
  backend_.linear_multi(s.h, rows, h, qkv);  // fused Q/K/V: one op
  float *q = s.q, *k = s.k;
  if (l.q_norm.data) {  // Qwen3: RMSNorm over head_dim of every q and k head, before RoPE
    backend_.rms_norm(s.q, rows * c.num_heads, c.head_dim, l.q_norm, eps, q = s.qn);
    backend_.rms_norm(s.k, rows * c.num_kv_heads, c.head_dim, l.k_norm, eps, k = s.kn);
  }
  backend_.rope_store_kv(li, weights_->inv_freq, q, k, s.v, c.num_heads, meta);
  backend_.paged_attention(li, q, c.num_heads, meta, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), s.attn);
  backend_.linear(s.attn, rows, qd, l.o, h, l.o_bias, s.x);
  backend_.add_rms_norm(s.residual, s.x, rows, h, l.post_norm, eps, s.h);
  run_mlp(li, rows);
}

// The MLP block: s.x = mlp(s.h), dense SwiGLU or the sparse MoE block.
void ModelRunner::run_mlp(std::int64_t li, std::int64_t rows) {
  Scratch& s = *scratch_;
  if (moe_->sparse(li)) {
    moe_->forward(li, s.h, rows, s.x);
    return;
  }
  const ModelConfig& c = model_.config();
  const Weights::Layer& l = weights_->layers[static_cast<std::size_t>(li)];
  const std::int64_t h = c.hidden_size;
  const Backend::LinearOut gate_up[] = {{l.gate, c.intermediate_size, l.gate_bias, s.gate},
                                        {l.up, c.intermediate_size, l.up_bias, s.up}};
  backend_.linear_multi(s.h, rows, h, gate_up);  // fused gate/up: one op
  backend_.silu_mul(s.gate, s.up, rows * c.intermediate_size);
  backend_.linear(s.gate, rows, c.intermediate_size, l.down, h, l.down_bias, s.x);
}

double ModelRunner::ep_exchange_seconds() const { return moe_->exchange_seconds(); }

std::vector<float> ModelRunner::forward(const ForwardBatch& batch) {
  const std::span<float> logits = forward_view(batch);
  return {logits.begin(), logits.end()};
}

std::span<float> ModelRunner::forward_view(const ForwardBatch& batch) {
  const ModelConfig& c = model_.config();
  Scratch& s = *scratch_;
  const auto rows = static_cast<std::int64_t>(batch.num_tokens());
  if (rows == 0) {
    if (moe_->expert_parallel()) {  // an idle rank still serves its experts to the others
      moe_->begin_step();
      moe_->idle_step();
      expert_tokens_ = moe_->step_counts();
    }
    return {};
  }
  if (rows > options_.max_batch_tokens)
    throw std::invalid_argument("batch of " + std::to_string(rows) + " tokens exceeds max_batch_tokens " +
                                std::to_string(options_.max_batch_tokens));
  // Host-side metadata for every row, then one upload each.
  std::vector<std::int32_t> &ids = s.h_ids, &positions = s.h_positions, &table_offsets = s.h_table_offsets;
  std::vector<std::int32_t> &tables = s.h_tables, &logit_rows = s.h_logit_rows;
  std::vector<std::int64_t>& slots = s.h_slots;
  for (auto* v : {&ids, &positions, &table_offsets, &tables, &logit_rows}) v->clear();
  slots.clear();
  for (const SeqChunk& chunk : batch.chunks) {
    const auto offset = static_cast<std::int32_t>(tables.size());
    tables.insert(tables.end(), chunk.block_table.begin(), chunk.block_table.end());
    const auto n = static_cast<std::int64_t>(chunk.tokens.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const TokenId id = chunk.tokens[static_cast<std::size_t>(i)];
      const std::int64_t pos = chunk.start_pos + i, block_index = pos / options_.block_size;
      if (id < 0 || id >= c.vocab_size)
        throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                    std::to_string(c.vocab_size) + ")");
      if (block_index >= static_cast<std::int64_t>(chunk.block_table.size()))
        throw std::invalid_argument("block table too short for position " + std::to_string(pos));
      const std::int32_t block = chunk.block_table[static_cast<std::size_t>(block_index)];
      if (block < 0 || block >= options_.num_blocks) throw std::invalid_argument("block id out of range");
      const bool want = chunk.logits == SeqChunk::Logits::all || (chunk.logits == SeqChunk::Logits::last && i == n - 1);
      if (want) logit_rows.push_back(static_cast<std::int32_t>(ids.size()));
      ids.push_back(id);
      positions.push_back(static_cast<std::int32_t>(pos));
      slots.push_back(std::int64_t{block} * options_.block_size + pos % options_.block_size);
      table_offsets.push_back(offset);
    }
  }
  if (static_cast<std::int64_t>(tables.size()) > s.tables_capacity) {
    if (s.tables) backend_.deallocate(s.tables);
    s.tables_capacity = static_cast<std::int64_t>(tables.size()) * 2;
    s.tables = static_cast<std::int32_t*>(backend_.allocate(static_cast<std::size_t>(s.tables_capacity) * 4));
  }
  auto up = [&](void* dst, const auto& v) { backend_.to_device(dst, v.data(), v.size() * sizeof(v[0])); };
  up(s.ids, ids);
  up(s.positions, positions);
  up(s.slots, slots);
  up(s.table_offsets, table_offsets);
  up(s.tables, tables);
  up(s.logit_rows, logit_rows);
  const AttentionMeta meta{rows, s.positions, s.slots, s.table_offsets, s.tables,
                           *std::max_element(positions.begin(), positions.end()),
                           static_cast<std::int32_t>(batch.chunks.size())};

  backend_.embedding(weights_->embed, c.hidden_size, s.ids, rows, s.residual);
  moe_->begin_step();
  for (std::int64_t li = 0; li < c.num_layers; ++li) run_layer(li, rows, meta);
  if (c.moe.enabled()) expert_tokens_ = moe_->step_counts();
  backend_.add_rms_norm(s.residual, s.x, rows, c.hidden_size, weights_->final_norm,
                        static_cast<float>(c.rms_norm_eps), s.h);
  // lm_head only on the rows whose logits are wanted: gather them first.
  const auto n = static_cast<std::int64_t>(logit_rows.size());
  const auto need = static_cast<std::size_t>(n * c.vocab_size);
  if (host_logits_.size() < need) host_logits_.resize(need);
  const std::span<float> out(host_logits_.data(), need);
  if (n == 0) return out;
  backend_.embedding({s.h, DType::f32}, c.hidden_size, s.logit_rows, n, s.logits_in);
  backend_.linear(s.logits_in, n, c.hidden_size, weights_->lm_head, c.vocab_size, {}, s.logits);
  backend_.to_host(out.data(), s.logits, out.size() * sizeof(float));
  return out;
}

std::vector<float> all_position_logits(const Model& model, Backend& backend, std::span<const TokenId> ids) {
  RunnerOptions ro;
  ro.num_blocks = static_cast<std::int64_t>(ids.size()) / ro.block_size + 1;
  ro.max_batch_tokens = std::max<std::int64_t>(1, static_cast<std::int64_t>(ids.size()));
  ModelRunner runner(model, backend, ro);
  std::vector<std::int32_t> table(static_cast<std::size_t>(ro.num_blocks));
  std::iota(table.begin(), table.end(), 0);
  ForwardBatch batch;
  batch.chunks.push_back({ids, 0, table, SeqChunk::Logits::all});
  return runner.forward(batch);
}

}  // namespace kvfleet
