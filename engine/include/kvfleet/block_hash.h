// Contract 1 (docs/architecture.md): chained block hashes. The router and the engine both call these
// functions, so a prefix hashes to the same values on both sides, bit for bit.
//
//   root  = XXH3_64bits_withSeed(namespace bytes, 0)
//   h[i]  = XXH3_64bits_withSeed(tokens[i*B .. i*B+B) as little-endian uint32, seed = h[i-1]),
//   h[-1] = root
//
// The namespace is the served model name, followed by '\0' and the cache salt when a salt is given
// (so requests of different tenants or LoRA adapters never share blocks). Only full blocks are hashed.
#pragma once

#include <xxhash.h>

#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvfleet {

using BlockHash = std::uint64_t;
using TokenId = std::int32_t;

inline BlockHash block_hash_root(std::string_view model_name, std::string_view cache_salt = {}) {
  if (cache_salt.empty()) return XXH3_64bits_withSeed(model_name.data(), model_name.size(), 0);
  std::string bytes;
  bytes.reserve(model_name.size() + 1 + cache_salt.size());
  bytes.append(model_name).push_back('\0');
  bytes.append(cache_salt);
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), 0);
}

// Hash of one full block given its parent's hash (the root for the first block).
inline BlockHash block_hash_next(BlockHash parent, std::span<const TokenId> block) {
  static_assert(std::endian::native == std::endian::little, "block hashes assume a little-endian host");
  return XXH3_64bits_withSeed(block.data(), block.size() * sizeof(TokenId), parent);
}

// Hashes of every full block of `tokens`, in order; a trailing partial block is not hashed.
inline std::vector<BlockHash> block_hashes(BlockHash root, std::span<const TokenId> tokens,
                                           std::size_t block_size) {
  std::vector<BlockHash> out;
  if (block_size == 0) return out;
  out.reserve(tokens.size() / block_size);
  BlockHash parent = root;
  for (std::size_t start = 0; start + block_size <= tokens.size(); start += block_size) {
    parent = block_hash_next(parent, tokens.subspan(start, block_size));
    out.push_back(parent);
  }
  return out;
}

}  // namespace kvfleet
