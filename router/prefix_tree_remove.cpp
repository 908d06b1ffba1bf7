// PrefixTree: removing marks (KV "removed"/"cleared" events, departing replicas, TTL, LRU under the
// memory bound), freeing unmarked nodes, and the integrity check the tests run after every step.
#include <algorithm>
#include <bit>
#include <queue>
#include <stdexcept>
#include <string>

#include "router/prefix_tree.h"

namespace kvfleet::router {

std::size_t PrefixTree::remove(ReplicaId r, std::span<const BlockHash> blocks) {
  std::size_t removed = 0;
  for (const BlockHash h : blocks) {
    Ref ref{};
    if (!index_find(h, ref) || !has(ref.node, r)) continue;
    const NodeId top = ref.offset == 0 ? ref.node : split(ref.node, ref.offset);
    drop_subtree_mark(top, r);
    ++removed;
  }
  return removed;
}

// Drops r from `top` and every descendant r holds, then frees what no replica holds any more.
void PrefixTree::drop_subtree_mark(NodeId top, ReplicaId r) {
  std::vector<NodeId> stack{top}, emptied_tops;
  while (!stack.empty()) {
    const NodeId x = stack.back();
    stack.pop_back();
    drop_mark(x, r);
    // Parents are handled before children, so an emptied node under an emptied parent is skipped:
    // freeing the parent frees it.
    if (nodes_[x].replicas == 0 && (x == top || nodes_[nodes_[x].parent].replicas != 0)) emptied_tops.push_back(x);
    for (NodeId c = nodes_[x].first_child; c != kNil; c = nodes_[c].next_sibling) {
      if (has(c, r)) stack.push_back(c);
    }
  }
  for (const NodeId x : emptied_tops) free_subtree(x);
}

void PrefixTree::free_subtree(NodeId top) {
  unlink_child(top);
  std::vector<NodeId> stack{top};
  while (!stack.empty()) {
    const NodeId x = stack.back();
    stack.pop_back();
    Node& n = nodes_[x];
    for (NodeId c = n.first_child; c != kNil; c = nodes_[c].next_sibling) stack.push_back(c);
    for (std::uint32_t j = 0; j < n.edge_len; ++j) index_erase(n.edge[j]);
    const auto holders = static_cast<std::size_t>(std::popcount(n.replicas));
    block_count_ -= n.edge_len;
    entry_count_ -= n.edge_len * holders;
    tick_count_ -= holders;
    --node_count_;
    n = Node{};
    n.parent = kFree;
    free_nodes_.push_back(x);
  }
}

// Frees every maximal unmarked subtree (prefix closure makes an unmarked node's subtree unmarked).
void PrefixTree::free_unmarked() {
  for (NodeId id = 1; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (!n.live() || n.replicas != 0) continue;
    if (n.parent == kRoot || nodes_[n.parent].replicas != 0) free_subtree(id);
  }
}

void PrefixTree::clear_replica(ReplicaId r) {
  for (NodeId id = 1; id < nodes_.size(); ++id) {
    if (nodes_[id].live() && has(id, r)) drop_mark(id, r);
  }
  free_unmarked();
}

// Ticks never grow towards the leaves, so an expired mark's descendants (for the same replica) are
// expired too and dropping them all at once keeps the prefix closure.
std::size_t PrefixTree::expire(ReplicaMask replicas, Tick cutoff) {
  std::size_t dropped = 0;
  for (NodeId id = 1; id < nodes_.size(); ++id) {
    if (!nodes_[id].live()) continue;
    for (ReplicaMask m = nodes_[id].replicas & replicas; m != 0; m &= m - 1) {
      const auto r = static_cast<ReplicaId>(std::countr_zero(m));
      if (tick(id, r) < cutoff) {
        drop_mark(id, r);
        ++dropped;
      }
    }
  }
  free_unmarked();
  return dropped;
}

bool PrefixTree::child_has(NodeId n, ReplicaId r) const {
  for (NodeId c = nodes_[n].first_child; c != kNil; c = nodes_[c].next_sibling) {
    if (has(c, r)) return true;
  }
  return false;
}

// LRU over leaf marks: (node, r) where no child of node is held by r. Dropping one may make the
// parent a leaf mark of r, which joins the queue. Ties go to the higher node id (created later,
// usually deeper), then the higher replica, so the order is fully determined.
std::size_t PrefixTree::evict(std::size_t target_bytes) {
  if (bytes() <= target_bytes) return 0;
  struct Candidate {
    Tick tick;
    NodeId node;
    ReplicaId replica;
    bool operator>(const Candidate& o) const {
      if (tick != o.tick) return tick > o.tick;
      if (node != o.node) return node < o.node;
      return replica < o.replica;
    }
  };
  std::vector<ReplicaMask> held_below(nodes_.size(), 0);
  for (NodeId id = 1; id < nodes_.size(); ++id) {
    if (nodes_[id].live()) held_below[nodes_[id].parent] |= nodes_[id].replicas;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (NodeId id = 1; id < nodes_.size(); ++id) {
    if (!nodes_[id].live()) continue;
    for (ReplicaMask m = nodes_[id].replicas & ~held_below[id]; m != 0; m &= m - 1) {
      const auto r = static_cast<ReplicaId>(std::countr_zero(m));
      queue.push(Candidate{tick(id, r), id, r});
    }
  }
  std::size_t evicted = 0;
  while (bytes() > target_bytes && !queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    const NodeId parent = nodes_[c.node].parent;
    drop_mark(c.node, c.replica);
    if (nodes_[c.node].replicas == 0) free_subtree(c.node);  // a leaf: its children were r's only
    ++evicted;
    if (parent != kRoot && !child_has(parent, c.replica)) {
      queue.push(Candidate{tick(parent, c.replica), parent, c.replica});
    }
  }
  return evicted;
}

void PrefixTree::check_integrity() const {
  const auto fail = [](const std::string& what) { throw std::logic_error("PrefixTree integrity: " + what); };
  if (nodes_.empty() || !nodes_[kRoot].live() || nodes_[kRoot].edge_len != 0 || nodes_[kRoot].replicas != 0) {
    fail("bad root");
  }
  std::size_t nodes = 0, blocks = 0, entries = 0, ticks = 0;
  std::vector<NodeId> stack{kRoot};
  while (!stack.empty()) {
    const NodeId x = stack.back();
    stack.pop_back();
    const Node& n = nodes_[x];
    NodeId prev = kNil;
    for (NodeId c = n.first_child; c != kNil; c = nodes_[c].next_sibling) {
      if (!nodes_[c].live() || nodes_[c].parent != x || nodes_[c].prev_sibling != prev) {
        fail("child links of node " + std::to_string(x));
      }
      prev = c;
      stack.push_back(c);
    }
    if (x == kRoot) continue;
    if (n.replicas == 0) fail("node " + std::to_string(x) + " is held by no replica");
    if (n.edge_len == 0) fail("node " + std::to_string(x) + " has an empty edge");
    const bool under_root = n.parent == kRoot;
    if (!under_root && (n.replicas & ~nodes_[n.parent].replicas) != 0) fail("prefix closure at node " + std::to_string(x));
    for (ReplicaMask m = n.replicas; m != 0; m &= m - 1) {
      const auto r = static_cast<ReplicaId>(std::countr_zero(m));
      if (!under_root && tick(x, r) > tick(n.parent, r)) fail("tick grows below node " + std::to_string(n.parent));
    }
    for (std::uint32_t j = 0; j < n.edge_len; ++j) {
      Ref ref{};
      if (!index_find(n.edge[j], ref) || ref.node != x || ref.offset != j) {
        fail("index entry of node " + std::to_string(x) + " offset " + std::to_string(j));
      }
    }
    ++nodes;
    blocks += n.edge_len;
    entries += n.edge_len * static_cast<std::size_t>(std::popcount(n.replicas));
    ticks += static_cast<std::size_t>(std::popcount(n.replicas));
  }
  std::size_t live = 0;
  for (NodeId id = 1; id < nodes_.size(); ++id) live += nodes_[id].live() ? 1 : 0;
  if (live != nodes) fail("unreachable live nodes");
  if (nodes != node_count_ || blocks != block_count_ || entries != entry_count_ || ticks != tick_count_) {
    fail("counters");
  }
  if (slot_count_ != blocks) fail("index holds " + std::to_string(slot_count_) + " entries for " + std::to_string(blocks) + " blocks");
  if (live + free_nodes_.size() + 1 != nodes_.size()) fail("free list");
}

}  // namespace kvfleet::router
