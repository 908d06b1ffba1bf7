// TierIndex: which replicas hold which KV blocks below their device pools (docs/architecture.md, "KV cache
// tiers" and Contract 2's `medium`), next to the PrefixTree that holds the device blocks.
//
// Entries. One per block hash: the replicas whose host tier holds it, those whose disk tier holds it, and
// the shared tiers (groups) that hold it. A shared tier is a directory several replicas mount; each replica
// names its own in its config event (`shared_tier`, an id derived from the directory's identity file and the
// blocks' compatibility hash), and every replica naming the same id is a member of one group. A block any
// member wrote to the shared tier counts for every member.
//
// Match. A replica's engine finds a prompt's prefix as: the leading blocks its device pool holds, then block
// after block host, disk or shared until the first block in none of them. match() walks the prompt the same
// way for every replica at once (64-bit masks) and reports, per replica, how many leading blocks it reaches
// and the best medium of each (device > host > disk > shared), so that a policy can weigh them.
//
// Unlike the device tree there is no prefix closure: the device pool evicts a chain tail first, so the host
// tier often holds a block whose parent is still on the device. Removals are per block.
//
// Bound. At most max_blocks entries; over it, the entries stored longest ago go first, down to evict_to of
// the bound (an entry missing only makes a replica look colder than it is). Shared marks have no removal
// event (no replica deletes from a shared tier): they leave by this bound only.
//
// Thread-safety: none (as PrefixTree); match() is const.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "router/prefix_tree.h"

namespace kvfleet::router {

// Where a replica keeps a block; the order is the order of preference.
enum class Medium : std::uint8_t { device, host, disk, shared };
inline constexpr std::size_t kNumMedia = 4;
const char* to_string(Medium m);
std::optional<Medium> medium_from_string(std::string_view s);

struct TierIndexConfig {
  std::size_t max_blocks = 1u << 20;  // entries kept (each about 80 bytes)
  double evict_to = 0.9;
};

struct TierMatch {
  // blocks[r][m]: leading prompt blocks replica r reaches whose best medium is m.
  std::array<std::array<std::uint32_t, kNumMedia>, kMaxReplicas> blocks{};
  std::uint32_t of(ReplicaId r, Medium m) const { return r < kMaxReplicas ? blocks[r][static_cast<std::size_t>(m)] : 0; }
  std::uint32_t reachable(ReplicaId r) const;
};

class TierIndex {
 public:
  explicit TierIndex(TierIndexConfig config = {}) : config_(config) {}

  // r's shared tier (0: none). An id seen for the first time makes a group; false when 64 groups exist
  // already (r then has none).
  bool set_shared(ReplicaId r, std::uint64_t shared_id);
  std::uint64_t shared_id(ReplicaId r) const;

  // r's host or disk tier took / dropped these blocks.
  void stored(ReplicaId r, Medium m, std::span<const BlockHash> hashes, Tick now);
  void removed(ReplicaId r, Medium m, std::span<const BlockHash> hashes);
  // r wrote these blocks to its shared tier: every member of its group may read them. Ignored without one.
  void stored_shared(ReplicaId r, std::span<const BlockHash> hashes, Tick now);
  // Drops r's host and disk marks (a cleared event, a restart, a departure); the shared marks stay.
  void clear_replica(ReplicaId r);
  // clear_replica, and r leaves its group.
  void remove_replica(ReplicaId r);

  // `device`: the PrefixTree's match of the same hashes.
  TierMatch match(std::span<const BlockHash> hashes, const MatchResult& device) const;

  std::size_t size() const { return entries_.size(); }
  std::uint64_t evicted() const { return evicted_; }
  // r's marks in medium m (host, disk) or, for shared, the blocks in r's group (/admin, tests).
  std::size_t count(ReplicaId r, Medium m) const;

 private:
  struct Entry {
    ReplicaMask host = 0, disk = 0;
    std::uint64_t groups = 0;  // bit g: shared group g
    Tick stored = 0;
    bool empty() const { return host == 0 && disk == 0 && groups == 0; }
  };
  ReplicaMask& field(Entry& e, Medium m) { return m == Medium::host ? e.host : e.disk; }
  Entry& entry(BlockHash h, Tick now);  // created if missing; its stored tick := now
  void maybe_evict();
  ReplicaMask shared_holders(std::uint64_t groups) const;
  void set_bit(Entry& e, Medium m, ReplicaId r);
  void clear_bit(Entry& e, Medium m, ReplicaId r);
  void uncount(const Entry& e);  // an entry about to be erased

  TierIndexConfig config_;
  std::unordered_map<BlockHash, Entry> entries_;
  std::array<std::optional<std::uint32_t>, kMaxReplicas> group_of_{};  // replica -> group
  std::vector<std::uint64_t> group_ids_;                                // group -> shared id
  std::array<ReplicaMask, 64> members_{};                               // group -> replicas
  std::array<std::array<std::size_t, 2>, kMaxReplicas> counts_{};  // replica -> {host, disk} marks
  std::array<std::size_t, 64> group_counts_{};                       // group -> blocks
  std::uint64_t evicted_ = 0;
};

}  // namespace kvfleet::router
