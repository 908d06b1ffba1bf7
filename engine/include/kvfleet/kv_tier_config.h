// KV cache tiers below the device pool (engine/kvtier/, docs/architecture.md "KV cache tiers"): what the
// engine is configured with and what it counts. All tiers off by default: the engine then behaves exactly as
// without this header.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace kvfleet {

// Where a cached block lies. The device pool is `device`; the others are engine/kvtier's tiers.
enum class KvMedium : std::uint8_t { device, host, disk, shared };
inline constexpr std::size_t kNumKvMedia = 4;
const char* to_string(KvMedium medium);

// One landing of a sequence's prefix blocks from a lower tier in the device pool: `blocks` from `medium`, from
// when the tier was asked for them (a file read starts; a host copy begins) to when they were in the device pool
// (unix nanoseconds). For tracing (RequestOutput::kv_tier_loads).
struct KvTierLoad {
  KvMedium medium = KvMedium::host;
  std::int32_t blocks = 0;
  std::uint64_t start_ns = 0, end_ns = 0;
};

struct KvTierConfig {
  std::int64_t host_bytes = 0;  // --kv-host-gib: RAM for blocks evicted from the device pool; 0: no host tier
  std::string disk_dir;         // --kv-disk-dir: this replica's block files; empty: no disk tier
  std::int64_t disk_bytes = 0;  // --kv-disk-gib: the disk tier's bound (required with disk_dir)
  std::string shared_dir;       // --kv-shared-dir: block files several replicas read and write; empty: none
  // --kv-shared-index-blocks: shared blocks this replica remembers (written or found), least recently used
  // forgotten first; a forgotten block is looked up in the directory again (its file stays).
  std::int64_t shared_index_blocks = 1 << 18;
  std::int32_t io_threads = 2;  // threads writing and reading block files
  bool enabled() const { return host_bytes > 0 || !disk_dir.empty() || !shared_dir.empty(); }
};

// Why a stored block was not used.
enum class KvTierError : std::uint8_t { truncated, corrupt, foreign, io };
inline constexpr std::size_t kNumKvTierErrors = 4;
const char* to_string(KvTierError error);

// One tier's figures (the device's entry only counts hits; its bytes are the pool's).
struct KvTierMediumStats {
  std::uint64_t hit_tokens = 0;      // prompt tokens admission found in this tier
  std::uint64_t blocks = 0;          // blocks held now
  std::uint64_t bytes = 0;           // their bytes
  std::uint64_t offload_bytes = 0;   // bytes written into this tier
  std::uint64_t onload_bytes = 0;    // bytes copied from this tier into device blocks
  double offload_seconds = 0.0;      // time spent writing them (disk and shared: on the I/O threads)
  double onload_seconds = 0.0;       // time spent reading them back
  std::array<std::uint64_t, kNumKvTierErrors> errors{};  // by KvTierError
};

struct KvTierStats {
  bool enabled = false;  // some tier is configured
  std::uint64_t shared_tier_id = 0;  // the shared tier's identity (engine/kvtier/tier_identity.h); 0: none
  std::array<KvTierMediumStats, kNumKvMedia> media{};  // by KvMedium
};

}  // namespace kvfleet
