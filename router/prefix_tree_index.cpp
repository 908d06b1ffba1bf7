// The hash -> (node, offset) index of PrefixTree: linear probing over 8-byte slots, deletion by
// backward shift (no tombstones). A slot does not store the hash: it stores where the hash lives
// (node 32 bits, offset 20 bits) plus a 12-bit tag, and the hash is read back from the node's edge
// only when the tag matches. That halves the index (8 instead of 16 bytes per block), which is
// most of how the tree stays near 18 bytes per block.
#include <bit>

#include "router/prefix_tree.h"

namespace kvfleet::router {
namespace {

constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
constexpr std::uint64_t kTagMask = 0xFFF;
constexpr std::uint64_t kOffsetMask = 0xFFFFF;

// Block hashes are XXH3 outputs, but tests use small integers: mix so both spread.
std::uint64_t mix(BlockHash h) { return h * 0x9E3779B97F4A7C15ull; }
std::uint64_t tag_of(BlockHash h) { return mix(h) & kTagMask; }
std::size_t home_of(BlockHash h, std::size_t mask) { return static_cast<std::size_t>(mix(h) >> 20) & mask; }

}  // namespace

BlockHash PrefixTree::hash_at(std::uint64_t slot) const {
  const auto node = static_cast<NodeId>(slot >> 32);
  const auto offset = static_cast<std::uint32_t>((slot >> 12) & kOffsetMask);
  return nodes_[node].edge[offset];
}

bool PrefixTree::index_find(BlockHash h, Ref& out) const {
  if (slots_.empty()) return false;
  const std::size_t mask = slots_.size() - 1;
  const std::uint64_t tag = tag_of(h);
  for (std::size_t i = home_of(h, mask);; i = (i + 1) & mask) {
    const std::uint64_t s = slots_[i];
    if (s == kEmpty) return false;
    if ((s & kTagMask) == tag && hash_at(s) == h) {
      out = Ref{static_cast<NodeId>(s >> 32), static_cast<std::uint32_t>((s >> 12) & kOffsetMask)};
      return true;
    }
  }
}

bool PrefixTree::index_insert(BlockHash h, Ref ref) {
  if ((slot_count_ + 1) * 5 > slots_.size() * 4) index_grow();  // keep the load <= 0.8
  const std::size_t mask = slots_.size() - 1;
  const std::uint64_t tag = tag_of(h);
  for (std::size_t i = home_of(h, mask);; i = (i + 1) & mask) {
    const std::uint64_t s = slots_[i];
    if (s == kEmpty) {
      slots_[i] = (std::uint64_t{ref.node} << 32) | (std::uint64_t{ref.offset} << 12) | tag;
      ++slot_count_;
      return true;
    }
    if ((s & kTagMask) == tag && hash_at(s) == h) return false;
  }
}

void PrefixTree::index_update(BlockHash h, Ref ref) {
  const std::size_t mask = slots_.size() - 1;
  const std::uint64_t tag = tag_of(h);
  for (std::size_t i = home_of(h, mask);; i = (i + 1) & mask) {
    const std::uint64_t s = slots_[i];
    if (s == kEmpty) return;  // not indexed: nothing to move
    if ((s & kTagMask) == tag && hash_at(s) == h) {
      slots_[i] = (std::uint64_t{ref.node} << 32) | (std::uint64_t{ref.offset} << 12) | tag;
      return;
    }
  }
}

void PrefixTree::index_erase(BlockHash h) {
  if (slots_.empty()) return;
  const std::size_t mask = slots_.size() - 1;
  const std::uint64_t tag = tag_of(h);
  std::size_t i = home_of(h, mask);
  for (;; i = (i + 1) & mask) {
    const std::uint64_t s = slots_[i];
    if (s == kEmpty) return;
    if ((s & kTagMask) == tag && hash_at(s) == h) break;
  }
  // Backward shift: pull later entries of the run into the hole when their home allows it.
  for (std::size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    const std::uint64_t s = slots_[j];
    if (s == kEmpty) break;
    const std::size_t k = home_of(hash_at(s), mask);
    const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      slots_[i] = s;
      i = j;
    }
  }
  slots_[i] = kEmpty;
  --slot_count_;
}

void PrefixTree::index_grow() {
  std::vector<std::uint64_t> old = std::move(slots_);
  slots_.assign(old.empty() ? 16 : old.size() * 2, kEmpty);
  const std::size_t mask = slots_.size() - 1;
  for (const std::uint64_t s : old) {
    if (s == kEmpty) continue;
    std::size_t i = home_of(hash_at(s), mask);
    while (slots_[i] != kEmpty) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

}  // namespace kvfleet::router
