// PrefixTree: which replica holds which prefix of block hashes in its KV cache (docs/architecture.md, data
// flow: tokenize -> block hashes -> PrefixTree.match -> Policy.choose).
//
// A radix tree over chained block hashes (Contract 1): each edge is a run of hashes stored in one
// array, and an edge splits where two chains diverge (SGLang's gateway tree does the same over
// characters). Because a block hash already identifies its whole prefix, a global open-addressing
// index maps every stored hash to (node, offset). It serves three purposes: a "removed" KV event for
// one block finds that block in O(1), the walk down the tree finds the child that starts with the
// next hash without a per-node child map, and it makes every hash appear at most once in the tree.
//
// Marks. Each node has a 64-bit set of the replicas that hold its whole edge, and one last-use tick
// per holding replica. Invariant ("prefix closure"): a replica that marks a node marks its parent,
// because an engine only keeps a block when it keeps the block's parent (a chained hash is useless
// without its prefix). Consequences, by design:
//   - remove(r, {h}) drops r's mark on the block h AND on every descendant of h (the edge splits at
//     h first when h is mid-edge). A later "removed" event for such a descendant is then a no-op.
//   - a node that no replica marks is freed at once, with its subtree (which is unmarked too).
//   - ticks never decrease towards the leaves' side: a node's tick for r >= each child's tick for r.
// Nodes are never merged back after a removal; a split edge stays split (cheap, and keeps ticks).
//
// Memory. bytes() is a deterministic estimate of the live data (node records, 8 bytes per hash,
// 10 bytes of index per hash = one 8-byte slot at the 0.8 maximum load, 8 bytes per tick); the
// memory bound (max_bytes) is enforced against it by evicting least recently used leaf marks (a
// mark (node, r) where no child of node is marked by r) down to evict_to * max_bytes.
// allocated_bytes() reports the capacities actually reserved (index slack, free node records).
//
// Thread-safety: none. match() and stats() are const and may run concurrently with each other;
// everything else needs exclusive access (the router keeps the tree behind a lock or on a strand).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::router {

using ReplicaId = std::uint32_t;      // a slot in [0, kMaxReplicas), assigned by the replica set
using ReplicaMask = std::uint64_t;    // bit r set = replica r
using Tick = std::uint64_t;           // caller's clock (the router uses steady-clock milliseconds)
inline constexpr ReplicaId kMaxReplicas = 64;

struct PrefixTreeConfig {
  std::uint64_t max_bytes = 0;  // bound on bytes(); 0 = unbounded
  double evict_to = 0.9;        // when over the bound, evict down to this fraction of it
};

struct TreeStats {
  std::size_t nodes = 0;            // excluding the root
  std::size_t blocks = 0;           // distinct block hashes stored
  std::size_t entries = 0;          // (block, replica) marks
  std::size_t bytes = 0;            // live estimate, the one the memory bound uses
  std::size_t allocated_bytes = 0;  // reserved capacity (>= bytes, minus allocator headers)
};

struct MatchResult {
  std::array<std::uint32_t, kMaxReplicas> blocks{};  // leading blocks of the prompt each replica holds
  std::uint32_t longest = 0;                          // leading blocks present in the tree at all
  std::uint32_t of(ReplicaId r) const { return r < kMaxReplicas ? blocks[r] : 0; }
};

class PrefixTree {
 public:
  explicit PrefixTree(PrefixTreeConfig config = {});
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // Replica r holds the chain root -> hashes[0] -> ... -> hashes.back(); ticks on the path := now.
  // May evict (memory bound). Stops early, keeping what it placed, if a hash already sits elsewhere
  // in the tree (only a 64-bit collision can cause that).
  void insert(ReplicaId r, std::span<const BlockHash> hashes, Tick now);
  // Exact mode "stored" event: the chain continues after the block `parent` (r then holds the path
  // to parent too). A parent the tree does not have (evicted by the memory bound, or never seen)
  // drops the chain and returns false: no prompt can match a chain without its prefix, and placing
  // it at the root would make it an orphan that stops the later, correct insert of the same chain
  // (every hash appears once in the tree). The caller handles the namespace root (use insert()).
  bool insert_after(ReplicaId r, BlockHash parent, std::span<const BlockHash> hashes, Tick now);

  // Read-only: per replica, how many leading blocks of `hashes` it holds. O(prompt length).
  MatchResult match(std::span<const BlockHash> hashes) const;
  // Marks r's held part of this prefix as used at `now` (a routing decision reused it).
  void touch(ReplicaId r, std::span<const BlockHash> hashes, Tick now);

  // Drops r's marks on each named block and on its descendants. Returns how many of the named
  // blocks r held (blocks already gone, or unknown, count 0).
  std::size_t remove(ReplicaId r, std::span<const BlockHash> blocks);
  // Drops every mark of r (a "cleared" event); remove_replica is the same for a departing replica.
  void clear_replica(ReplicaId r);
  void remove_replica(ReplicaId r) { clear_replica(r); }
  // Drops the marks of replicas in `replicas` last used before `cutoff` (TTL). Returns marks dropped.
  std::size_t expire(ReplicaMask replicas, Tick cutoff);
  // Evicts least recently used leaf marks until bytes() <= target. Returns marks evicted.
  std::size_t evict(std::size_t target_bytes);

  TreeStats stats() const;
  std::size_t bytes() const;
  // Which replicas hold the block, and r's tick on it (0 if r does not hold it); for tests/debug.
  ReplicaMask holders(BlockHash block) const;
  Tick last_used(ReplicaId r, BlockHash block) const;
  // Throws std::logic_error naming the first broken invariant.
  void check_integrity() const;

 private:
  using NodeId = std::uint32_t;
  static constexpr NodeId kNil = 0xFFFFFFFFu;
  static constexpr NodeId kFree = 0xFFFFFFFEu;  // parent of a node on the free list
  static constexpr NodeId kRoot = 0;
  // 48 bytes. The hashes of the edge live in one exact-size array; ticks are ranked by replica
  // bit (ticks[k] belongs to the k-th set bit of `replicas`), so a node costs 8 bytes per holder.
  struct Node {
    std::unique_ptr<BlockHash[]> edge;
    std::unique_ptr<Tick[]> ticks;
    ReplicaMask replicas = 0;
    NodeId parent = kNil, first_child = kNil, next_sibling = kNil, prev_sibling = kNil;
    std::uint32_t edge_len = 0;
    bool live() const { return parent != kFree; }
  };
  struct Ref {
    NodeId node;
    std::uint32_t offset;
  };
  struct Cursor {
    NodeId node;
    std::uint32_t consumed;  // blocks of node's edge on the path
  };

  // prefix_tree.cpp: walking, marking, splitting
  void insert_from(ReplicaId r, Cursor at, std::span<const BlockHash> hashes, Tick now);
  void mark_path(ReplicaId r, NodeId node, Tick now);
  NodeId split(NodeId node, std::uint32_t at);
  NodeId add_leaf(NodeId parent, std::span<const BlockHash> hashes, std::size_t& placed);
  NodeId alloc_node();
  void link_child(NodeId parent, NodeId child);
  void unlink_child(NodeId child);
  bool has(NodeId n, ReplicaId r) const;
  Tick& tick(NodeId n, ReplicaId r);
  Tick tick(NodeId n, ReplicaId r) const;
  void add_mark(NodeId n, ReplicaId r, Tick now);
  void drop_mark(NodeId n, ReplicaId r);
  void maybe_evict();

  // prefix_tree_remove.cpp: removal, freeing, expiry, eviction
  void drop_subtree_mark(NodeId top, ReplicaId r);
  void free_subtree(NodeId top);
  void free_unmarked();
  bool child_has(NodeId n, ReplicaId r) const;

  // prefix_tree_index.cpp: the hash -> (node, offset) table
  bool index_find(BlockHash h, Ref& out) const;
  bool index_insert(BlockHash h, Ref ref);  // false if h is present
  void index_update(BlockHash h, Ref ref);
  void index_erase(BlockHash h);
  void index_grow();
  BlockHash hash_at(std::uint64_t slot) const;

  PrefixTreeConfig config_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<NodeId> free_nodes_;
  std::vector<std::uint64_t> slots_;  // the index: node(32) | offset(20) | tag(12); ~0 = empty
  std::size_t slot_count_ = 0;
  std::size_t node_count_ = 0, block_count_ = 0, entry_count_ = 0, tick_count_ = 0;
};

}  // namespace kvfleet::router
