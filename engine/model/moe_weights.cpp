#include "engine/model/moe_weights.h"

namespace kvfleet {
namespace {

// Rows [row, row + rows) of slice `index` of a 3-D tensor [n][d1][d2], as a [rows][d2] view.
TensorView slice(const TensorView& t, std::int64_t index, std::int64_t row, std::int64_t rows, const char* what) {
  const std::int64_t d1 = t.shape[1], d2 = t.shape[2];
  TensorView v;
  v.dtype = t.dtype;
  v.shape = {rows, d2};
  v.file = t.file;
  v.name = t.name + "[" + std::to_string(index) + "]." + what;
  const auto offset = static_cast<std::size_t>((index * d1 + row) * d2) * dtype_size(t.dtype);
  v.data = static_cast<const std::uint8_t*>(t.data) + offset;
  return v;
}

// Mixtral checkpoints written before transformers 5 name the block `block_sparse_moe`; transformers 5
// (and Qwen always) names it `mlp`.
std::string block_prefix(const Checkpoint& ck, const ModelConfig& c, const std::string& layer) {
  if (c.model_type == "mixtral" && ck.contains(layer + "block_sparse_moe.gate.weight")) return layer + "block_sparse_moe.";
  if (ck.contains(layer + "mlp.gate.weight")) return layer + "mlp.";
  if (c.model_type == "mixtral")
    throw ModelError("tensor '" + layer + "block_sparse_moe.gate.weight' (or '" + layer +
                     "mlp.gate.weight') not found: the MoE router of a sparse layer");
  (void)ck.get(layer + "mlp.gate.weight");  // throws, naming the tensor and the files searched
  return {};
}

}  // namespace

MoeLayerWeights load_moe_layer(const Checkpoint& ck, const ModelConfig& c, const std::string& layer) {
  const MoeConfig& m = c.moe;
  const std::int64_t h = c.hidden_size, e = m.num_experts, ff = m.expert_intermediate;
  const std::string p = block_prefix(ck, c, layer);
  MoeLayerWeights w;
  w.router = &ck.get(p + "gate.weight", {e, h});
  w.packed = ck.contains(p + "experts.gate_up_proj");
  if (w.packed) {
    const TensorView& gate_up = ck.get(p + "experts.gate_up_proj", {e, 2 * ff, h});
    const TensorView& down = ck.get(p + "experts.down_proj", {e, h, ff});
    for (std::int64_t i = 0; i < e; ++i)
      w.experts.push_back({slice(gate_up, i, 0, ff, "gate"), slice(gate_up, i, ff, ff, "up"),
                           slice(down, i, 0, h, "down")});
  } else {
    const bool mixtral = c.model_type == "mixtral";
    for (std::int64_t i = 0; i < e; ++i) {
      const std::string x = p + "experts." + std::to_string(i) + ".";
      w.experts.push_back({ck.get(x + (mixtral ? "w1" : "gate_proj") + ".weight", {ff, h}),
                           ck.get(x + (mixtral ? "w3" : "up_proj") + ".weight", {ff, h}),
                           ck.get(x + (mixtral ? "w2" : "down_proj") + ".weight", {h, ff})});
    }
  }
  if (m.shared_intermediate > 0) {
    const std::int64_t s = m.shared_intermediate;
    w.shared_gate = &ck.get(p + "shared_expert.gate_proj.weight", {s, h});
    w.shared_up = &ck.get(p + "shared_expert.up_proj.weight", {s, h});
    w.shared_down = &ck.get(p + "shared_expert.down_proj.weight", {h, s});
    w.shared_expert_gate = &ck.get(p + "shared_expert_gate.weight", {1, h});
  }
  return w;
}

}  // namespace kvfleet
