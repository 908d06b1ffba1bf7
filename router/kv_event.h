// One Contract 2 KV event (shared/DESIGN.md), as the router reads it from a replica's
// /v1/kv_events stream:
//   {"type":"config","seq":N,"block_size":B,"root":H}                       (opens every stream)
//   {"seq":N,"type":"stored"|"removed"|"cleared","block_hashes":[...],"parent":H,"tier":"gpu"|"cpu"}
// Hashes are JSON integers (uint64; a negative int64 is read as its two's complement bits, for
// writers that only have signed integers) or strings ("123" or "0x7b"). "tier" is accepted and
// ignored: a block offloaded to CPU memory is still a cached block the replica can reuse.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::router {

struct KvEventMessage {
  enum class Type : std::uint8_t { config, stored, removed, cleared };
  Type type = Type::stored;
  std::uint64_t seq = 0;
  std::uint64_t block_size = 0;  // config
  BlockHash root = 0;            // config
  std::vector<BlockHash> block_hashes;
  std::optional<BlockHash> parent;  // stored; absent or null = the chain starts at the root
};

// Throws std::invalid_argument with a message naming the bad or missing field.
KvEventMessage parse_kv_event(std::string_view json);

}  // namespace kvfleet::router
