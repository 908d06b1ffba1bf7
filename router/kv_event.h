// One Contract 2 KV event (docs/architecture.md), as the router reads it from a replica's
// /v1/kv_events stream:
//   {"type":"config","seq":N,"block_size":B,"root":H,"instance":I}          (opens every stream)
//   {"seq":N,"type":"stored"|"removed"|"cleared","block_hashes":[...],"parent":H,"tier":"gpu"|"cpu"}
//   {"type":"load","waiting":W,"running":R,"kv_usage":U}   (no seq; only on streams that asked load=1)
// A type this router does not know is `unknown` and ignored (carrying no seq of its own), so that
// replicas can add event types without breaking older routers.
// "instance" (new at every replica start) tells a restarted replica apart even when its seq has
// passed ours. A snapshot is {"seq":S,"type":"cleared","snapshot":K} followed by K events
// {"seq":S,"type":"stored","snapshot":true,...}: the same seq, applied in full (Contract 2).
// Hashes are JSON integers (uint64; a negative int64 is read as its two's complement bits, for
// writers that only have signed integers) or strings ("123" or "0x7b"). "tier" is accepted and
// ignored: a block offloaded to CPU memory is still a cached block the replica can reuse. "medium" (absent:
// "device") names a replica's KV tier below its device pool ("host", "disk", "shared"): the router keeps
// those blocks in its TierIndex, not in its tree; a medium it does not know counts its seq and nothing else.
// The config event of a replica with a shared tier carries "shared_tier":ID (TierIndex groups).
// Expert-parallel replicas (several data-parallel ranks behind one endpoint): the config event carries
// "dp_size":N, and "per_rank":true on a stream asked with per_rank=1, whose stored/removed/load events
// each carry the "dp_rank" of the rank they are about (ReplicaCacheIndex::set_ranks).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kvfleet/block_hash.h"
#include "router/tier_index.h"

namespace kvfleet::router {

struct KvEventMessage {
  enum class Type : std::uint8_t { config, stored, removed, cleared, load, unknown };
  Type type = Type::stored;
  std::uint64_t seq = 0;
  std::uint64_t block_size = 0;  // config
  BlockHash root = 0;            // config
  std::vector<BlockHash> block_hashes;
  std::optional<BlockHash> parent;  // stored; absent or null = the chain starts at the root
  std::optional<std::uint64_t> instance;  // config; absent from older replicas
  std::uint64_t snapshot_blocks = 0;      // cleared: how many snapshot `stored` events follow
  bool snapshot = false;                  // stored: part of the snapshot after a `cleared`
  std::uint32_t waiting = 0, running = 0;  // load: the replica's sequences
  double kv_usage = 0;                     // load: KV cache usage in [0, 1]
  std::int32_t dp_rank = -1;               // stored/removed/load: the rank it is about (-1: none given)
  std::uint32_t dp_size = 1;               // config: data-parallel ranks behind the endpoint
  bool per_rank = false;                   // config: the stream's events are per rank (dp_rank on each)
  // stored/removed: where the blocks entered or left ("medium"); nullopt: a medium this router does not know.
  std::optional<Medium> medium = Medium::device;
  std::uint64_t shared_tier = 0;           // config: the replica's shared KV tier (0: none)
  // Not on the wire: the rest of the event with this seq, split off by split_kv_event().
  bool continuation = false;
};

// Most block hashes one event may carry (a 1M-token prompt at block size 16): more is malformed.
inline constexpr std::size_t kMaxEventHashes = 65'536;

// Throws std::invalid_argument with a message naming the bad or missing field.
KvEventMessage parse_kv_event(std::string_view json);

// A stored/removed event cut into pieces of at most `max_hashes` hashes (the first piece keeps the
// event's meaning; the others are continuations, a stored one continuing after the previous piece's
// last block), so that the router applies a huge event without holding its lock for all of it.
std::vector<KvEventMessage> split_kv_event(KvEventMessage event, std::size_t max_hashes);

}  // namespace kvfleet::router
