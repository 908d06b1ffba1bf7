#include "kvfleet/make_model.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "kvfleet/files.h"
#include "kvfleet/safetensors.h"
#include "kvfleet/sampler.h"

namespace kvfleet {
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text << '\n';
  if (!out) throw ModelError(p.string() + ": cannot write");
}

// Values uniform in [center - scale, center + scale), from a counter-based generator so a model is the
// same on every machine for a given seed.
class Filler {
 public:
  Filler(std::uint64_t seed, DType dtype) : seed_(seed), dtype_(dtype) {}
  TensorData make(std::vector<std::int64_t> shape, double scale, double center = 0.0) {
    TensorData t{dtype_, std::move(shape), {}};
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    t.bytes.resize(static_cast<std::size_t>(n) * dtype_size(dtype_));
    for (std::int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<float>(center + scale * (2.0 * uniform_draw(seed_, counter_++) - 1.0));
      auto* dst = t.bytes.data() + i * static_cast<std::int64_t>(dtype_size(dtype_));
      if (dtype_ == DType::f32) {
        std::memcpy(dst, &v, 4);
      } else {
        const std::uint16_t h = dtype_ == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(dst, &h, 2);
      }
    }
    return t;
  }

 private:
  std::uint64_t seed_, counter_ = 0;
  DType dtype_;
};

struct TokenizerInfo {
  std::int64_t vocab = 0;
  json::object ids;  // "bos_token_id", "eos_token_id" where they can be resolved
};

// Copies tokenizer files next to the model and reads the vocabulary size and special ids they imply.
TokenizerInfo copy_tokenizer(const fs::path& src, const fs::path& out) {
  const fs::path dir = fs::is_directory(src) ? src : src.parent_path();
  const fs::path tok = fs::is_directory(src) ? src / "tokenizer.json" : src;
  if (!fs::exists(tok)) throw ModelError(tok.string() + ": not found");
  fs::copy_file(tok, out / "tokenizer.json", fs::copy_options::overwrite_existing);
  for (const char* f : {"tokenizer_config.json", "special_tokens_map.json"})
    if (fs::exists(dir / f)) fs::copy_file(dir / f, out / f, fs::copy_options::overwrite_existing);

  TokenizerInfo info;
  const json::value t = read_json_file(tok);
  std::map<std::string, std::int64_t> by_token;
  if (const auto* vocab = t.at("model").as_object().if_contains("vocab"); vocab && vocab->is_object())
    for (const auto& [k, v] : vocab->as_object()) by_token[std::string(k)] = v.to_number<std::int64_t>();
  if (const auto* added = t.as_object().if_contains("added_tokens"))
    for (const auto& a : added->as_array())
      by_token[std::string(a.at("content").as_string())] = a.at("id").to_number<std::int64_t>();
  for (const auto& [k, id] : by_token) info.vocab = std::max(info.vocab, id + 1);
  if (fs::exists(dir / "tokenizer_config.json")) {
    const json::value cfg = read_json_file(dir / "tokenizer_config.json");
    for (const char* key : {"bos_token", "eos_token"}) {
      const json::value* v = cfg.as_object().if_contains(key);
      if (!v) continue;
      std::string text = v->is_string() ? std::string(v->as_string())
                         : v->is_object() && v->as_object().contains("content") ? std::string(v->at("content").as_string())
                                                                                : "";
      if (auto it = by_token.find(text); it != by_token.end()) info.ids[std::string(key) + "_id"] = it->second;
    }
  }
  return info;
}

const char* architecture_class(const std::string& arch) {
  if (arch == "qwen2") return "Qwen2ForCausalLM";
  if (arch == "mistral") return "MistralForCausalLM";
  if (arch == "mixtral") return "MixtralForCausalLM";
  if (arch == "qwen2_moe") return "Qwen2MoeForCausalLM";
  if (arch == "qwen3_moe") return "Qwen3MoeForCausalLM";
  return "LlamaForCausalLM";
}

// The MoE keys of MixtralConfig / Qwen2MoeConfig / Qwen3MoeConfig.
void add_moe_config(const MakeModelOptions& o, json::object& c) {
  c["num_experts_per_tok"] = o.experts_per_tok;
  if (o.arch == "mixtral") {
    c["num_local_experts"] = o.experts;
    c["router_jitter_noise"] = 0.0;
    c["sliding_window"] = nullptr;
    return;
  }
  c["num_experts"] = o.experts;
  c["moe_intermediate_size"] = o.moe_intermediate;
  c["norm_topk_prob"] = o.norm_topk_prob;
  c["decoder_sparse_step"] = o.decoder_sparse_step;
  json::array only;
  for (auto l : o.mlp_only_layers) only.push_back(l);
  c["mlp_only_layers"] = only;
  if (o.arch == "qwen2_moe") c["shared_expert_intermediate_size"] = o.shared_intermediate;
  if (o.arch == "qwen3_moe") c["attention_bias"] = false;
}

json::object make_config(const MakeModelOptions& o, std::int64_t vocab, const TokenizerInfo& tok) {
  const char* cls = architecture_class(o.arch);
  json::object c{{"architectures", json::array{cls}}, {"model_type", o.arch}, {"vocab_size", vocab},
                 {"hidden_size", o.hidden}, {"intermediate_size", o.intermediate},
                 {"num_hidden_layers", o.layers}, {"num_attention_heads", o.heads},
                 {"num_key_value_heads", o.kv_heads}, {"max_position_embeddings", o.max_position},
                 {"rms_norm_eps", 1e-6}, {"rope_theta", o.rope_theta}, {"hidden_act", "silu"},
                 {"tie_word_embeddings", o.tie_embeddings}, {"initializer_range", 0.02},
                 {"torch_dtype", o.dtype == DType::bf16 ? "bfloat16" : o.dtype == DType::f16 ? "float16" : "float32"}};
  if (o.head_dim || o.arch == "qwen3_moe") c["head_dim"] = o.head_dim ? o.head_dim : o.hidden / o.heads;
  if (is_moe_arch(o.arch)) add_moe_config(o, c);
  if (o.arch == "llama") c["attention_bias"] = o.attention_bias;
  if (o.arch == "mistral") c["sliding_window"] = nullptr;
  if (o.rope_scaling == "linear") c["rope_scaling"] = json::object{{"rope_type", "linear"}, {"factor", o.rope_factor}};
  if (o.rope_scaling == "llama3")
    c["rope_scaling"] = json::object{{"rope_type", "llama3"}, {"factor", o.rope_factor}, {"low_freq_factor", 1.0},
                                     {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 256}};
  for (const auto& [k, v] : tok.ids) c[k] = v;
  if (!c.contains("eos_token_id")) c["eos_token_id"] = vocab - 1;
  if (!c.contains("bos_token_id")) c["bos_token_id"] = 0;
  return c;
}

void write_checkpoint(const std::map<std::string, TensorData>& tensors, int shards, const fs::path& out) {
  if (shards <= 1) {
    write_safetensors(out / "model.safetensors", tensors, {{"format", "pt"}});
    return;
  }
  std::vector<std::map<std::string, TensorData>> parts(static_cast<std::size_t>(shards));
  json::object weight_map;
  std::size_t i = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const std::size_t s = i++ % static_cast<std::size_t>(shards);
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05d.safetensors", s + 1, shards);
    weight_map[name] = file;
    parts[s].emplace(name, t);
    total += t.bytes.size();
  }
  for (std::size_t s = 0; s < parts.size(); ++s) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05d.safetensors", s + 1, shards);
    write_safetensors(out / file, parts[s], {{"format", "pt"}});
  }
  json::object index{{"metadata", json::object{{"total_size", total}}}, {"weight_map", weight_map}};
  write_text(out / "model.safetensors.index.json", json::serialize(index));
}

bool is_sparse(const MakeModelOptions& o, std::int64_t layer) {
  if (o.arch == "mixtral") return true;
  if (std::find(o.mlp_only_layers.begin(), o.mlp_only_layers.end(), layer) != o.mlp_only_layers.end()) return false;
  return (layer + 1) % o.decoder_sparse_step == 0;
}

// The sparse block of one layer: router, experts (generated expert by expert, gate then up then down, so
// both layouts hold the same values), and qwen2_moe's shared expert.
template <class Lin>
void add_moe_layer(const MakeModelOptions& o, const std::string& p, Lin&& lin, std::map<std::string, TensorData>& t) {
  const bool mixtral = o.arch == "mixtral";
  const std::int64_t h = o.hidden, ff = mixtral ? o.intermediate : o.moe_intermediate;
  const std::string block = p + (mixtral && !o.packed_experts ? "block_sparse_moe." : "mlp.");
  t[block + "gate.weight"] = lin(o.experts, h);
  TensorData gate_up{o.dtype, {o.experts, 2 * ff, h}, {}}, down{o.dtype, {o.experts, h, ff}, {}};
  for (std::int64_t e = 0; e < o.experts; ++e) {
    TensorData g = lin(ff, h), u = lin(ff, h), d = lin(h, ff);
    if (o.packed_experts) {
      for (const TensorData* part : {&g, &u}) gate_up.bytes.insert(gate_up.bytes.end(), part->bytes.begin(), part->bytes.end());
      down.bytes.insert(down.bytes.end(), d.bytes.begin(), d.bytes.end());
      continue;
    }
    const std::string x = block + "experts." + std::to_string(e) + ".";
    t[x + (mixtral ? "w1" : "gate_proj") + ".weight"] = std::move(g);
    t[x + (mixtral ? "w3" : "up_proj") + ".weight"] = std::move(u);
    t[x + (mixtral ? "w2" : "down_proj") + ".weight"] = std::move(d);
  }
  if (o.packed_experts) {
    t[block + "experts.gate_up_proj"] = std::move(gate_up);
    t[block + "experts.down_proj"] = std::move(down);
  }
  if (o.arch == "qwen2_moe" && o.shared_intermediate > 0) {
    const std::int64_t s = o.shared_intermediate;
    t[block + "shared_expert.gate_proj.weight"] = lin(s, h);
    t[block + "shared_expert.up_proj.weight"] = lin(s, h);
    t[block + "shared_expert.down_proj.weight"] = lin(h, s);
    t[block + "shared_expert_gate.weight"] = lin(1, h);
  }
}

void check_options(const MakeModelOptions& o) {
  if (o.arch != "llama" && o.arch != "qwen2" && o.arch != "mistral" && !is_moe_arch(o.arch))
    throw std::invalid_argument("--arch must be llama, qwen2, mistral, mixtral, qwen2_moe or qwen3_moe, not '" + o.arch + "'");
  if (o.heads <= 0 || o.kv_heads <= 0 || o.heads % o.kv_heads != 0)
    throw std::invalid_argument("--kv-heads must divide --heads");
  if (is_moe_arch(o.arch) && (o.experts <= 0 || o.experts_per_tok <= 0 || o.experts_per_tok > o.experts))
    throw std::invalid_argument("--experts-per-tok must be in [1, --experts]");
  if (is_moe_arch(o.arch) && o.decoder_sparse_step <= 0) throw std::invalid_argument("--decoder-sparse-step must be positive");
}

}  // namespace

bool is_moe_arch(const std::string& arch) { return arch == "mixtral" || arch == "qwen2_moe" || arch == "qwen3_moe"; }

void make_model(const MakeModelOptions& o, const fs::path& out) {
  check_options(o);
  fs::create_directories(out);
  TokenizerInfo tok;
  if (!o.tokenizer.empty()) tok = copy_tokenizer(o.tokenizer, out);
  const std::int64_t vocab = std::max(o.vocab, tok.vocab);
  const std::int64_t hd = o.head_dim ? o.head_dim : o.hidden / o.heads;
  const std::int64_t qd = o.heads * hd, kvd = o.kv_heads * hd, h = o.hidden, ff = o.intermediate;

  Filler fill(o.seed, o.dtype);
  auto lin = [&](std::int64_t out_f, std::int64_t in_f) {
    return fill.make({out_f, in_f}, std::sqrt(3.0 / static_cast<double>(in_f)));
  };
  std::map<std::string, TensorData> t;
  t["model.embed_tokens.weight"] = fill.make({vocab, h}, 1.0);
  for (std::int64_t i = 0; i < o.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = fill.make({h}, 0.2, 1.0);
    t[p + "self_attn.q_proj.weight"] = lin(qd, h);
    t[p + "self_attn.k_proj.weight"] = lin(kvd, h);
    t[p + "self_attn.v_proj.weight"] = lin(kvd, h);
    t[p + "self_attn.o_proj.weight"] = lin(h, qd);
    if (o.arch == "qwen2" || o.arch == "qwen2_moe" || o.attention_bias) {
      t[p + "self_attn.q_proj.bias"] = fill.make({qd}, 0.2);
      t[p + "self_attn.k_proj.bias"] = fill.make({kvd}, 0.2);
      t[p + "self_attn.v_proj.bias"] = fill.make({kvd}, 0.2);
    }
    if (o.arch == "llama" && o.attention_bias) t[p + "self_attn.o_proj.bias"] = fill.make({h}, 0.2);
    if (o.arch == "qwen3_moe") {
      t[p + "self_attn.q_norm.weight"] = fill.make({hd}, 0.2, 1.0);
      t[p + "self_attn.k_norm.weight"] = fill.make({hd}, 0.2, 1.0);
    }
    t[p + "post_attention_layernorm.weight"] = fill.make({h}, 0.2, 1.0);
    if (is_moe_arch(o.arch) && is_sparse(o, i)) {
      add_moe_layer(o, p, lin, t);
      continue;
    }
    t[p + "mlp.gate_proj.weight"] = lin(ff, h);
    t[p + "mlp.up_proj.weight"] = lin(ff, h);
    t[p + "mlp.down_proj.weight"] = lin(h, ff);
  }
  t["model.norm.weight"] = fill.make({h}, 0.2, 1.0);
  if (!o.tie_embeddings) t["lm_head.weight"] = lin(vocab, h);
  write_checkpoint(t, o.shards, out);
  write_text(out / "config.json", json::serialize(make_config(o, vocab, tok)));
}

}  // namespace kvfleet
