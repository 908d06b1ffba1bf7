// PrefixTree: walking the tree, placing chains, marks and edge splits. Removal, expiry, eviction
// and the integrity check are in prefix_tree_remove.cpp; the hash index in prefix_tree_index.cpp.
#include "router/prefix_tree.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace kvfleet::router {
namespace {

constexpr std::uint32_t kMaxEdge = (1u << 20) - 1;  // the index stores offsets in 20 bits
constexpr std::size_t kIndexBytesPerBlock = 10;     // one 8-byte slot at the 0.8 maximum load

std::uint32_t rank_of(ReplicaMask mask, ReplicaId r) {
  return static_cast<std::uint32_t>(std::popcount(mask & ((ReplicaMask{1} << r) - 1)));
}

std::unique_ptr<BlockHash[]> copy_hashes(const BlockHash* from, std::size_t n) {
  auto out = std::make_unique_for_overwrite<BlockHash[]>(n);
  std::memcpy(out.get(), from, n * sizeof(BlockHash));
  return out;
}

}  // namespace

PrefixTree::PrefixTree(PrefixTreeConfig config) : config_(config) { nodes_.emplace_back(); }

PrefixTree::~PrefixTree() = default;

// --- placing chains ------------------------------------------------------------------------------

void PrefixTree::insert(ReplicaId r, std::span<const BlockHash> hashes, Tick now) {
  insert_from(r, Cursor{kRoot, 0}, hashes, now);
  maybe_evict();
}

bool PrefixTree::insert_after(ReplicaId r, BlockHash parent, std::span<const BlockHash> hashes, Tick now) {
  Ref ref{};
  if (!index_find(parent, ref)) return false;  // an orphan placed at the root would block its real chain
  insert_from(r, Cursor{ref.node, ref.offset + 1}, hashes, now);
  maybe_evict();
  return true;
}

void PrefixTree::insert_from(ReplicaId r, Cursor at, std::span<const BlockHash> hashes, Tick now) {
  NodeId node = at.node;
  std::uint32_t consumed = at.consumed;
  std::size_t i = 0;
  const std::size_t m = hashes.size();
  for (;;) {
    while (i < m && consumed < nodes_[node].edge_len && nodes_[node].edge[consumed] == hashes[i]) {
      ++i;
      ++consumed;
    }
    if (consumed < nodes_[node].edge_len) {
      // Stopped inside the edge: the chain ends here or diverges. r may only mark the head part,
      // unless it already holds the whole edge.
      if (i == m && has(node, r)) break;
      split(node, consumed);
    }
    if (i == m) break;
    Ref ref{};
    if (index_find(hashes[i], ref)) {
      if (ref.offset != 0 || nodes_[ref.node].parent != node) break;  // sits elsewhere: a collision
      node = ref.node;
      consumed = 0;
      continue;
    }
    std::size_t placed = 0;
    const NodeId leaf = add_leaf(node, hashes.subspan(i), placed);
    if (leaf == kNil) break;
    node = leaf;
    consumed = nodes_[leaf].edge_len;
    i += placed;
  }
  mark_path(r, node, now);
}

void PrefixTree::mark_path(ReplicaId r, NodeId node, Tick now) {
  for (NodeId x = node; x != kRoot; x = nodes_[x].parent) add_mark(x, r, now);
}

PrefixTree::NodeId PrefixTree::add_leaf(NodeId parent, std::span<const BlockHash> hashes, std::size_t& placed) {
  const auto len = static_cast<std::uint32_t>(std::min<std::size_t>(hashes.size(), kMaxEdge));
  const NodeId id = alloc_node();
  nodes_[id].edge = std::make_unique_for_overwrite<BlockHash[]>(len);
  // The edge must hold each hash before it is indexed: probing reads hashes back from edges.
  std::uint32_t k = 0;
  for (; k < len; ++k) {
    nodes_[id].edge[k] = hashes[k];
    if (!index_insert(hashes[k], Ref{id, k})) break;
  }
  placed = k;
  if (k == 0) {
    nodes_[id] = Node{};
    nodes_[id].parent = kFree;
    free_nodes_.push_back(id);
    return kNil;
  }
  if (k < len) nodes_[id].edge = copy_hashes(nodes_[id].edge.get(), k);
  nodes_[id].edge_len = k;
  link_child(parent, id);
  ++node_count_;
  block_count_ += k;
  return id;
}

// Splits `node`'s edge before position `at`: node keeps [0, at), a new child takes [at, len) with
// node's marks, ticks and children. Returns the new child.
PrefixTree::NodeId PrefixTree::split(NodeId node, std::uint32_t at) {
  const NodeId t = alloc_node();  // may move nodes_: take references only after it
  Node& n = nodes_[node];
  Node& tail = nodes_[t];
  const std::uint32_t len = n.edge_len;
  tail.edge = copy_hashes(n.edge.get() + at, len - at);
  tail.edge_len = len - at;
  tail.replicas = n.replicas;
  const auto holders = static_cast<std::size_t>(std::popcount(n.replicas));
  tail.ticks = std::make_unique_for_overwrite<Tick[]>(holders);
  std::copy_n(n.ticks.get(), holders, tail.ticks.get());
  tail.first_child = n.first_child;
  for (NodeId c = tail.first_child; c != kNil; c = nodes_[c].next_sibling) nodes_[c].parent = t;
  n.first_child = kNil;
  link_child(node, t);
  // Re-point the tail's index entries while node's old edge still holds them (probing reads it).
  for (std::uint32_t j = 0; j < tail.edge_len; ++j) index_update(tail.edge[j], Ref{t, j});
  n.edge = copy_hashes(n.edge.get(), at);
  n.edge_len = at;
  ++node_count_;
  tick_count_ += holders;
  return t;
}

PrefixTree::NodeId PrefixTree::alloc_node() {
  if (!free_nodes_.empty()) {
    const NodeId id = free_nodes_.back();
    free_nodes_.pop_back();
    nodes_[id] = Node{};
    return id;
  }
  nodes_.emplace_back();
  return static_cast<NodeId>(nodes_.size() - 1);
}

void PrefixTree::link_child(NodeId parent, NodeId child) {
  Node& c = nodes_[child];
  c.parent = parent;
  c.prev_sibling = kNil;
  c.next_sibling = nodes_[parent].first_child;
  if (c.next_sibling != kNil) nodes_[c.next_sibling].prev_sibling = child;
  nodes_[parent].first_child = child;
}

void PrefixTree::unlink_child(NodeId child) {
  Node& c = nodes_[child];
  if (c.prev_sibling != kNil) {
    nodes_[c.prev_sibling].next_sibling = c.next_sibling;
  } else {
    nodes_[c.parent].first_child = c.next_sibling;
  }
  if (c.next_sibling != kNil) nodes_[c.next_sibling].prev_sibling = c.prev_sibling;
  c.prev_sibling = c.next_sibling = kNil;
}

// --- lookups -------------------------------------------------------------------------------------

MatchResult PrefixTree::match(std::span<const BlockHash> hashes) const {
  MatchResult out;
  NodeId node = kRoot;
  std::size_t i = 0;
  while (i < hashes.size()) {
    Ref ref{};
    if (!index_find(hashes[i], ref) || ref.offset != 0 || nodes_[ref.node].parent != node) break;
    const Node& n = nodes_[ref.node];
    const std::size_t room = std::min<std::size_t>(n.edge_len, hashes.size() - i);
    std::size_t j = 1;  // edge[0] == hashes[i]: the index said so
    while (j < room && n.edge[j] == hashes[i + j]) ++j;
    i += j;
    out.longest = static_cast<std::uint32_t>(i);
    // Prefix closure: a deeper node's holders are a subset, so later writes refine earlier ones.
    for (ReplicaMask m = n.replicas; m != 0; m &= m - 1) out.blocks[std::countr_zero(m)] = out.longest;
    if (j < n.edge_len) break;
    node = ref.node;
  }
  return out;
}

void PrefixTree::touch(ReplicaId r, std::span<const BlockHash> hashes, Tick now) {
  NodeId node = kRoot;
  std::size_t i = 0;
  while (i < hashes.size()) {
    Ref ref{};
    if (!index_find(hashes[i], ref) || ref.offset != 0 || nodes_[ref.node].parent != node) break;
    if (!has(ref.node, r)) break;  // prefix closure: r holds nothing deeper either
    Tick& t = tick(ref.node, r);
    t = std::max(t, now);
    const Node& n = nodes_[ref.node];
    std::size_t j = 1;
    while (j < n.edge_len && i + j < hashes.size() && n.edge[j] == hashes[i + j]) ++j;
    i += j;
    if (j < n.edge_len) break;
    node = ref.node;
  }
}

ReplicaMask PrefixTree::holders(BlockHash block) const {
  Ref ref{};
  return index_find(block, ref) ? nodes_[ref.node].replicas : 0;
}

Tick PrefixTree::last_used(ReplicaId r, BlockHash block) const {
  Ref ref{};
  return index_find(block, ref) && has(ref.node, r) ? tick(ref.node, r) : 0;
}

// --- marks ---------------------------------------------------------------------------------------

bool PrefixTree::has(NodeId n, ReplicaId r) const { return (nodes_[n].replicas >> r) & 1; }

Tick& PrefixTree::tick(NodeId n, ReplicaId r) { return nodes_[n].ticks[rank_of(nodes_[n].replicas, r)]; }

Tick PrefixTree::tick(NodeId n, ReplicaId r) const { return nodes_[n].ticks[rank_of(nodes_[n].replicas, r)]; }

void PrefixTree::add_mark(NodeId id, ReplicaId r, Tick now) {
  Node& n = nodes_[id];
  if (has(id, r)) {
    Tick& t = tick(id, r);
    t = std::max(t, now);
    return;
  }
  const auto count = static_cast<std::uint32_t>(std::popcount(n.replicas));
  const std::uint32_t k = rank_of(n.replicas, r);
  auto ticks = std::make_unique_for_overwrite<Tick[]>(count + 1);
  std::copy_n(n.ticks.get(), k, ticks.get());
  ticks[k] = now;
  std::copy_n(n.ticks.get() + k, count - k, ticks.get() + k + 1);
  n.ticks = std::move(ticks);
  n.replicas |= ReplicaMask{1} << r;
  entry_count_ += n.edge_len;
  ++tick_count_;
}

void PrefixTree::drop_mark(NodeId id, ReplicaId r) {
  Node& n = nodes_[id];
  const auto count = static_cast<std::uint32_t>(std::popcount(n.replicas));
  const std::uint32_t k = rank_of(n.replicas, r);
  if (count == 1) {
    n.ticks.reset();
  } else {
    auto ticks = std::make_unique_for_overwrite<Tick[]>(count - 1);
    std::copy_n(n.ticks.get(), k, ticks.get());
    std::copy_n(n.ticks.get() + k + 1, count - k - 1, ticks.get() + k);
    n.ticks = std::move(ticks);
  }
  n.replicas &= ~(ReplicaMask{1} << r);
  entry_count_ -= n.edge_len;
  --tick_count_;
}

// --- accounting ----------------------------------------------------------------------------------

std::size_t PrefixTree::bytes() const {
  return node_count_ * sizeof(Node) + block_count_ * (sizeof(BlockHash) + kIndexBytesPerBlock) +
         tick_count_ * sizeof(Tick);
}

TreeStats PrefixTree::stats() const {
  TreeStats s;
  s.nodes = node_count_;
  s.blocks = block_count_;
  s.entries = entry_count_;
  s.bytes = bytes();
  s.allocated_bytes = nodes_.capacity() * sizeof(Node) + free_nodes_.capacity() * sizeof(NodeId) +
                      block_count_ * sizeof(BlockHash) + tick_count_ * sizeof(Tick) +
                      slots_.capacity() * sizeof(std::uint64_t);
  return s;
}

void PrefixTree::maybe_evict() {
  if (config_.max_bytes == 0 || bytes() <= config_.max_bytes) return;
  evict(static_cast<std::size_t>(static_cast<double>(config_.max_bytes) * config_.evict_to));
}

}  // namespace kvfleet::router
