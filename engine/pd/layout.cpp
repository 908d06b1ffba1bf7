#include "engine/pd/layout.h"

#include <future>

#include "kvfleet/engine.h"
#include "kvfleet/model.h"

namespace kvfleet::pd {

std::uint64_t compat_hash(const KvLayout& l) {
  std::string bytes = l.model_name;
  bytes.push_back('\0');
  bytes += l.architecture;
  bytes.push_back('\0');
  const std::int64_t fields[] = {static_cast<std::int64_t>(l.dtype), static_cast<std::int64_t>(l.kv_dtype), l.num_layers,
                                 l.num_kv_heads, l.head_dim, l.block_size, static_cast<std::int64_t>(l.root)};
  bytes.append(reinterpret_cast<const char*>(fields), sizeof fields);
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string describe_mismatch(const KvLayout& a, const KvLayout& b) {
  std::string out;
  const auto field = [&](const char* name, const std::string& x, const std::string& y) {
    if (x == y) return;
    if (!out.empty()) out += "; ";
    out += std::string(name) + ": " + x + " here, " + y + " there";
  };
  const auto num = [](std::int64_t v) { return std::to_string(v); };
  field("model", a.model_name, b.model_name);
  field("architecture", a.architecture, b.architecture);
  field("dtype", std::string(dtype_name(a.dtype)), std::string(dtype_name(b.dtype)));
  field("kv_dtype", std::string(dtype_name(a.kv_dtype)), std::string(dtype_name(b.kv_dtype)));
  field("num_layers", num(a.num_layers), num(b.num_layers));
  field("num_kv_heads", num(a.num_kv_heads), num(b.num_kv_heads));
  field("head_dim", num(a.head_dim), num(b.head_dim));
  field("block_size", num(a.block_size), num(b.block_size));
  field("root", std::to_string(a.root), std::to_string(b.root));
  return out;
}

KvLayout layout_of(const Model& model, Engine& engine) {
  const ModelConfig& c = model.config();
  KvLayout l;
  l.model_name = engine.config().served_model_name;
  l.architecture = c.model_type;
  l.dtype = c.dtype;
  l.num_layers = c.num_layers;
  l.num_kv_heads = c.num_kv_heads;
  l.head_dim = c.head_dim;
  l.block_size = engine.config().block_size;
  l.root = block_hash_root(l.model_name);
  std::promise<DType> kv_dtype;
  engine.run_kv_task([&](Scheduler&, Backend& b) { kv_dtype.set_value(b.kv_dtype()); });
  l.kv_dtype = kv_dtype.get_future().get();
  return l;
}

}  // namespace kvfleet::pd
