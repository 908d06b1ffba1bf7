// One KV block in one file: the disk and shared tiers' storage format.
//
// A tier directory holds one folder per compatibility hash (hex), and in it one file per block named by the
// block's chained hash: `<dir>/<compat:016x>/<hash:016x>.kvblock`. The hash already carries the model name
// and the cache salt (Contract 1); the compatibility hash covers what else changes the bytes' meaning (model
// type, backend, KV dtype, layers, heads, head size, block size, this format's version), so replicas of
// different models or dtypes can share a directory without ever reading each other's blocks.
//
// File layout, little-endian:
//   0  magic "KVFBLK01"     8 bytes
//   8  compat               u64
//  16  hash                 u64   the block's chained hash (equal to the file name's)
//  24  parent               u64   the previous block's hash
//  32  block_size           u32   tokens
//  36  zero                 u32
//  40  payload_bytes        u64   every layer, K then V each (Contract 5's block layout, in the KV dtype)
//  48  checksum             u64   XXH3_64bits_withSeed(tokens || payload, seed = hash)
//  56  zero                 u64
//  64  tokens               block_size x i32
//      payload              payload_bytes
// A file is written under a temporary name in the same folder and renamed into place, so a reader sees a
// whole block or none, and concurrent writers of one block (same hash, same bytes) are harmless. A kill -9
// mid-write leaves at most a temporary file (`.*.tmp`), never a torn block. No fsync: a power loss may lose
// recent blocks (a miss), but a file that survives is verified on every read.
// Reading verifies everything: a short file is `truncated`, a bad magic, compat, hash, block size or payload
// size is `foreign`, a bad checksum or a longer file is `corrupt`; each is a miss, never used.
// Thread-safety: free functions on their arguments; any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "engine/kvtier/stored_block.h"
#include "kvfleet/backend.h"
#include "kvfleet/kv_tier_config.h"

namespace kvfleet::kvtier {

struct BlockFileFormat {
  std::uint64_t compat = 0;
  std::int32_t block_size = 0;
  std::size_t payload_bytes = 0;  // every layer of one block
  std::size_t file_bytes() const;
};

inline constexpr std::size_t kBlockFileHeaderBytes = 64;

// XXH3 over this format's version, the served model name, its model_type, the backend's name, the KV dtype and
// the cache shape (layers, KV heads, head size, block size): equal exactly when two engines' blocks of equal
// hash hold interchangeable bytes.
std::uint64_t block_compat_hash(std::string_view model_name, std::string_view model_type, const Backend& backend);

// `dir/<compat:016x>`: where a tier keeps this format's blocks.
std::filesystem::path block_folder(const std::filesystem::path& dir, std::uint64_t compat);
std::filesystem::path block_file(const std::filesystem::path& folder, BlockHash hash);
// The hash a block file's name gives, or nothing for any other name (temporary files included).
std::optional<BlockHash> block_file_hash(const std::string& filename);

// Writes `block` as `folder/<hash>.kvblock` (temp + rename). Empty on success, else why (errno's words).
std::string write_block_file(const std::filesystem::path& folder, const BlockFileFormat& format, const StoredBlock& block);

struct BlockFileRead {
  StoredBlockPtr block;                // set when the file is there and verified
  std::optional<KvTierError> error;    // set when the file is there but unusable (or unreadable)
};
// Reads and verifies `folder/<hash>.kvblock` (its bytes into a buffer of `buffers` when given); neither field
// set when there is no such file.
BlockFileRead read_block_file(const std::filesystem::path& folder, const BlockFileFormat& format, BlockHash hash,
                              BlockBuffers* buffers = nullptr);

}  // namespace kvfleet::kvtier
