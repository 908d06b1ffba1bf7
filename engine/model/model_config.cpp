#include "kvfleet/model_config.h"

#include <algorithm>
#include <boost/json.hpp>

#include "kvfleet/files.h"
#include "kvfleet/safetensors.h"

namespace kvfleet {
namespace json = boost::json;

namespace {

class Reader {
 public:
  Reader(const json::object& o, std::string source) : o_(o), source_(std::move(source)) {}

  bool has(std::string_view key) const { return o_.contains(key) && !o_.at(key).is_null(); }

  template <class T>
  T get(std::string_view key) const {
    if (!has(key)) fail(key, "is missing");
    return as<T>(key, o_.at(key));
  }
  template <class T>
  T get_or(std::string_view key, T fallback) const {
    return has(key) ? as<T>(key, o_.at(key)) : fallback;
  }
  [[noreturn]] void fail(std::string_view key, const std::string& why) const {
    throw ModelError(source_ + ": key '" + std::string(key) + "' " + why);
  }
  const json::value& at(std::string_view key) const { return o_.at(key); }

 private:
  template <class T>
  T as(std::string_view key, const json::value& v) const {
    try {
      if constexpr (std::is_same_v<T, std::string>) return std::string(v.as_string());
      else if constexpr (std::is_same_v<T, bool>) return v.as_bool();
      else if constexpr (std::is_floating_point_v<T>) return v.to_number<T>();
      else {
        const auto n = v.to_number<T>();
        if (n < 0) fail(key, "must not be negative");
        return n;
      }
    } catch (const ModelError&) {
      throw;
    } catch (const std::exception& e) {
      fail(key, std::string("has the wrong type: ") + e.what());
    }
  }
  const json::object& o_;
  std::string source_;
};

std::vector<TokenId> parse_ids(const Reader& r, std::string_view key) {
  std::vector<TokenId> ids;
  if (!r.has(key)) return ids;
  const auto& v = r.at(key);
  try {
    if (v.is_array())
      for (const auto& e : v.as_array()) ids.push_back(e.to_number<TokenId>());
    else
      ids.push_back(v.to_number<TokenId>());
  } catch (const std::exception& e) {  // a string, or a number no token id can be (boost's system_error)
    r.fail(key, std::string("must be a token id or a list of token ids: ") + e.what());
  }
  return ids;
}

// transformers < 5 writes `rope_scaling` (and a top-level rope_theta); transformers 5 writes
// `rope_parameters` with rope_theta and rope_type inside. Both are read.
RopeScaling parse_rope_scaling(const Reader& r) {
  RopeScaling s;
  const char* key = r.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!r.has(key)) return s;
  const auto* o = r.at(key).if_object();
  if (!o) r.fail(key, "must be an object or null");
  Reader rs(*o, std::string("config.json ") + key);
  const std::string type = rs.has("rope_type") ? rs.get<std::string>("rope_type") : rs.get_or<std::string>("type", "default");
  s.factor = rs.get_or<double>("factor", 1.0);
  if (type == "default") {
    s.kind = RopeScaling::Kind::none;
  } else if (type == "linear") {
    s.kind = RopeScaling::Kind::linear;
  } else if (type == "llama3") {
    s.kind = RopeScaling::Kind::llama3;
    s.low_freq_factor = rs.get<double>("low_freq_factor");
    s.high_freq_factor = rs.get<double>("high_freq_factor");
    s.original_max_position_embeddings = rs.get<std::int64_t>("original_max_position_embeddings");
  } else {
    r.fail(key, "has rope_type '" + type + "' (supported: default, linear, llama3)");
  }
  return s;
}

bool is_moe_type(const std::string& t) { return t == "mixtral" || t == "qwen2_moe" || t == "qwen3_moe"; }

// The MoE keys with the defaults of transformers' MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig.
MoeConfig parse_moe(const Reader& r, const std::string& type) {
  MoeConfig m;
  if (type == "mixtral") {
    m.num_experts = r.get_or<std::int64_t>("num_local_experts", 8);
    m.top_k = r.get_or<std::int64_t>("num_experts_per_tok", 2);
    m.expert_intermediate = r.get<std::int64_t>("intermediate_size");
    m.norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises
  } else {
    const bool q2 = type == "qwen2_moe";
    m.num_experts = r.get_or<std::int64_t>("num_experts", q2 ? 60 : 128);
    m.top_k = r.get_or<std::int64_t>("num_experts_per_tok", q2 ? 4 : 8);
    m.expert_intermediate = r.get_or<std::int64_t>("moe_intermediate_size", q2 ? 1408 : 768);
    if (q2) m.shared_intermediate = r.get_or<std::int64_t>("shared_expert_intermediate_size", 5632);
    m.norm_topk_prob = r.get_or<bool>("norm_topk_prob", false);
    m.decoder_sparse_step = r.get_or<std::int64_t>("decoder_sparse_step", 1);
    if (r.has("mlp_only_layers")) {
      const auto* a = r.at("mlp_only_layers").if_array();
      if (!a) r.fail("mlp_only_layers", "must be a list of layer indices");
      for (const auto& v : *a) m.mlp_only_layers.push_back(v.to_number<std::int64_t>());
    }
  }
  if (m.num_experts <= 0) r.fail(type == "mixtral" ? "num_local_experts" : "num_experts", "must be positive");
  if (m.top_k <= 0 || m.top_k > m.num_experts) r.fail("num_experts_per_tok", "must be in [1, number of experts]");
  if (m.expert_intermediate <= 0) r.fail("moe_intermediate_size", "must be positive");
  if (m.decoder_sparse_step <= 0) r.fail("decoder_sparse_step", "must be positive");
  return m;
}

}  // namespace

bool MoeConfig::is_sparse_layer(std::int64_t layer) const {
  if (!enabled()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;  // Qwen2MoeDecoderLayer's test
}

ModelConfig ModelConfig::parse(const std::string& text, const std::string& source) {
  json::value root;
  try {
    root = json::parse(text);
  } catch (const std::exception& e) {
    throw ModelError(source + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) throw ModelError(source + ": not a JSON object");
  Reader r(root.as_object(), source);
  ModelConfig c;
  c.model_type = r.get<std::string>("model_type");
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral" && !is_moe_type(c.model_type))
    r.fail("model_type", "is '" + c.model_type + "' (supported: llama, qwen2, mistral, mixtral, qwen2_moe, qwen3_moe)");
  c.vocab_size = r.get<std::int64_t>("vocab_size");
  c.hidden_size = r.get<std::int64_t>("hidden_size");
  c.intermediate_size = r.get<std::int64_t>("intermediate_size");
  c.num_layers = r.get<std::int64_t>("num_hidden_layers");
  c.num_heads = r.get<std::int64_t>("num_attention_heads");
  c.num_kv_heads = r.get_or<std::int64_t>("num_key_value_heads", c.num_heads);
  if (c.num_heads == 0 || c.num_kv_heads == 0 || c.num_heads % c.num_kv_heads != 0)
    r.fail("num_key_value_heads", "must divide num_attention_heads");
  c.head_dim = r.get_or<std::int64_t>("head_dim", c.hidden_size / c.num_heads);
  if (c.head_dim == 0 || c.head_dim % 2 != 0) r.fail("head_dim", "must be even and positive");
  c.max_position_embeddings = r.get_or<std::int64_t>("max_position_embeddings", 2048);
  c.rms_norm_eps = r.get_or<double>("rms_norm_eps", 1e-6);
  c.rope_theta = r.get_or<double>("rope_theta", 10000.0);
  c.rope_scaling = parse_rope_scaling(r);
  if (r.has("rope_parameters")) {
    const auto* rp = r.at("rope_parameters").if_object();
    if (rp && rp->contains("rope_theta")) c.rope_theta = Reader(*rp, source).get<double>("rope_theta");
  }
  c.tie_word_embeddings = r.get_or<bool>("tie_word_embeddings", false);
  const bool attention_bias = r.get_or<bool>("attention_bias", false);
  c.qkv_bias = c.model_type == "qwen2" || attention_bias;
  c.o_bias = c.model_type != "qwen2" && attention_bias;
  c.mlp_bias = r.get_or<bool>("mlp_bias", false);
  if (is_moe_type(c.model_type)) {
    c.moe = parse_moe(r, c.model_type);
    c.mlp_bias = false;  // none of the three has MLP biases
    if (c.model_type == "mixtral") {
      c.qkv_bias = c.o_bias = false;  // MixtralAttention is MistralAttention: no biases
    } else if (c.model_type == "qwen2_moe") {
      c.qkv_bias = r.get_or<bool>("qkv_bias", true);  // older configs lack the key: always biased
      c.o_bias = false;
    } else {
      c.qkv_bias = c.o_bias = attention_bias;  // Qwen3Attention: attention_bias on all four
      c.qk_norm = true;
    }
  }
  const std::string dt = r.has("torch_dtype") ? r.get<std::string>("torch_dtype") : r.get_or<std::string>("dtype", "float32");
  c.dtype = dt == "bfloat16" ? DType::bf16 : dt == "float16" ? DType::f16 : DType::f32;
  c.eos_token_ids = parse_ids(r, "eos_token_id");
  const auto bos = parse_ids(r, "bos_token_id");
  if (!bos.empty()) c.bos_token_id = bos.front();
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  if (!std::filesystem::exists(path)) throw ModelError(path.string() + ": not found (is this a Hugging Face model directory?)");
  ModelConfig c = parse(read_text_file(path), path.string());
  const auto gen = dir / "generation_config.json";
  if (std::filesystem::exists(gen)) {
    try {
      const auto v = read_json_file(gen);
      if (const auto* o = v.if_object()) {
        Reader r(*o, gen.string());
        for (TokenId id : parse_ids(r, "eos_token_id"))
          if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
            c.eos_token_ids.push_back(id);
      }
    } catch (const std::exception& e) {
      throw ModelError(gen.string() + ": " + e.what());
    }
  }
  return c;
}

}  // namespace kvfleet
