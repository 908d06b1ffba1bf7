#include "kvfleet/model.h"

#include "engine/model/moe_weights.h"

namespace kvfleet {

std::string Model::name() const {
  auto d = dir_;
  if (!d.has_filename()) d = d.parent_path();  // "dir/" -> "dir"
  return std::filesystem::absolute(d).lexically_normal().filename().string();
}

Model Model::load(const std::filesystem::path& dir) {
  Model m;
  m.dir_ = dir;
  m.config_ = ModelConfig::load(dir);
  m.checkpoint_ = Checkpoint::open(dir);
  const ModelConfig& c = m.config_;
  const Checkpoint& ck = m.checkpoint_;
  const std::int64_t h = c.hidden_size, q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  const std::int64_t ff = c.intermediate_size;

  m.embed_ = &ck.get("model.embed_tokens.weight", {c.vocab_size, h});
  m.final_norm_ = &ck.get("model.norm.weight", {h});
  if (c.tie_word_embeddings && !ck.contains("lm_head.weight"))
    m.lm_head_ = m.embed_;
  else
    m.lm_head_ = &ck.get("lm_head.weight", {c.vocab_size, h});

  auto optional = [&](const std::string& name, std::int64_t n, bool expected) -> const TensorView* {
    if (!expected && !ck.contains(name)) return nullptr;
    return &ck.get(name, {n});
  };
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.input_norm = &ck.get(p + "input_layernorm.weight", {h});
    l.q = &ck.get(p + "self_attn.q_proj.weight", {q_dim, h});
    l.k = &ck.get(p + "self_attn.k_proj.weight", {kv_dim, h});
    l.v = &ck.get(p + "self_attn.v_proj.weight", {kv_dim, h});
    l.o = &ck.get(p + "self_attn.o_proj.weight", {h, q_dim});
    l.q_bias = optional(p + "self_attn.q_proj.bias", q_dim, c.qkv_bias);
    l.k_bias = optional(p + "self_attn.k_proj.bias", kv_dim, c.qkv_bias);
    l.v_bias = optional(p + "self_attn.v_proj.bias", kv_dim, c.qkv_bias);
    l.o_bias = optional(p + "self_attn.o_proj.bias", h, c.o_bias);
    l.post_norm = &ck.get(p + "post_attention_layernorm.weight", {h});
    if (c.qk_norm) {
      l.q_norm = &ck.get(p + "self_attn.q_norm.weight", {c.head_dim});
      l.k_norm = &ck.get(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    if (c.moe.is_sparse_layer(i)) {
      l.moe = load_moe_layer(ck, c, p);
      m.layers_.push_back(std::move(l));
      continue;
    }
    l.gate = &ck.get(p + "mlp.gate_proj.weight", {ff, h});
    l.up = &ck.get(p + "mlp.up_proj.weight", {ff, h});
    l.down = &ck.get(p + "mlp.down_proj.weight", {h, ff});
    l.gate_bias = optional(p + "mlp.gate_proj.bias", ff, c.mlp_bias);
    l.up_bias = optional(p + "mlp.up_proj.bias", ff, c.mlp_bias);
    l.down_bias = optional(p + "mlp.down_proj.bias", h, c.mlp_bias);
    m.layers_.push_back(l);
  }
  return m;
}

}  // namespace kvfleet
