#include "kvfleet/make_model.h"

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

json::object make_config(const MakeModelOptions& o, std::int64_t vocab, const TokenizerInfo& tok) {
  const char* cls = o.arch == "qwen2" ? "Qwen2ForCausalLM" : o.arch == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM";
  json::object c{{"architectures", json::array{cls}}, {"model_type", o.arch}, {"vocab_size", vocab},
                 {"hidden_size", o.hidden}, {"intermediate_size", o.intermediate},
                 {"num_hidden_layers", o.layers}, {"num_attention_heads", o.heads},
                 {"num_key_value_heads", o.kv_heads}, {"max_position_embeddings", o.max_position},
                 {"rms_norm_eps", 1e-6}, {"rope_theta", o.rope_theta}, {"hidden_act", "silu"},
                 {"tie_word_embeddings", o.tie_embeddings}, {"initializer_range", 0.02},
                 {"torch_dtype", o.dtype == DType::bf16 ? "bfloat16" : o.dtype == DType::f16 ? "float16" : "float32"}};
  if (o.head_dim) c["head_dim"] = o.head_dim;
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

}  // namespace

void make_model(const MakeModelOptions& o, const fs::path& out) {
  if (o.arch != "llama" && o.arch != "qwen2" && o.arch != "mistral")
    throw std::invalid_argument("--arch must be llama, qwen2 or mistral, not '" + o.arch + "'");
  if (o.heads <= 0 || o.kv_heads <= 0 || o.heads % o.kv_heads != 0)
    throw std::invalid_argument("--kv-heads must divide --heads");
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
    if (o.arch == "qwen2" || o.attention_bias) {
      t[p + "self_attn.q_proj.bias"] = fill.make({qd}, 0.2);
      t[p + "self_attn.k_proj.bias"] = fill.make({kvd}, 0.2);
      t[p + "self_attn.v_proj.bias"] = fill.make({kvd}, 0.2);
    }
    if (o.arch == "llama" && o.attention_bias) t[p + "self_attn.o_proj.bias"] = fill.make({h}, 0.2);
    t[p + "post_attention_layernorm.weight"] = fill.make({h}, 0.2, 1.0);
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
