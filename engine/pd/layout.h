// KvLayout: what a prefill replica P and a decode replica D must agree on before KV blocks can move
// between them (DESIGN.md Contract 3), and its compatibility hash, checked at the transfer handshake.
// Blocks are shipped as the backend stores them (Contract 5: per block, per layer, K then V, each
// [num_kv_heads][block_size][head_dim], in kv_dtype), so every field below changes the bytes' meaning.
#pragma once

#include <cstdint>
#include <string>

#include "kvfleet/block_hash.h"
#include "kvfleet/dtype.h"

namespace kvfleet {
class Engine;
class Model;
}  // namespace kvfleet

namespace kvfleet::pd {

struct KvLayout {
  std::string model_name;    // the served name (the Contract 1 namespace)
  std::string architecture;  // config.json model_type
  DType dtype = DType::f32;     // the checkpoint's dtype
  DType kv_dtype = DType::f32;  // the KV cache's dtype (bf16 on a CUDA replica of a bf16 model)
  std::int64_t num_layers = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  BlockHash root = 0;  // block_hash_root(model_name): Contract 1

  // Bytes of one block of one layer (K and V).
  std::size_t layer_block_bytes() const {
    return static_cast<std::size_t>(2 * num_kv_heads * block_size * head_dim) * dtype_size(kv_dtype);
  }
  std::size_t block_bytes() const { return layer_block_bytes() * static_cast<std::size_t>(num_layers); }
  bool operator==(const KvLayout&) const = default;
};

// XXH3 over every field in a fixed order.
std::uint64_t compat_hash(const KvLayout& layout);
// "block_size: 16 here, 32 there; ..." naming each field that differs; empty when equal.
std::string describe_mismatch(const KvLayout& mine, const KvLayout& theirs);
// This replica's layout. Asks the engine thread for the backend's KV dtype (blocks until it answers).
KvLayout layout_of(const Model& model, Engine& engine);

}  // namespace kvfleet::pd
