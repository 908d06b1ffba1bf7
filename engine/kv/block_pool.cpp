#include "kvfleet/block_pool.h"

#include <stdexcept>

namespace kvfleet {

BlockPool::BlockPool(std::int32_t num_blocks) {
  if (num_blocks <= 0) throw std::invalid_argument("BlockPool: num_blocks must be positive");
  nodes_.resize(static_cast<std::size_t>(num_blocks));
  for (BlockId b = 0; b < num_blocks; ++b) push_back(b);
}

BlockId BlockPool::pop_free() {
  const BlockId b = head_;
  if (b == kNoBlock) throw std::logic_error("BlockPool::pop_free: no free block");
  unlink(b);
  nodes_[b].ref_count = 1;
  return b;
}

void BlockPool::acquire(BlockId b) {
  if (nodes_[b].ref_count++ == 0) unlink(b);
}

void BlockPool::release(BlockId b, bool cached) {
  Node& n = nodes_[b];
  if (n.ref_count <= 0) throw std::logic_error("BlockPool::release: block is already free");
  if (--n.ref_count > 0) return;
  if (cached) {
    push_back(b);
  } else {
    push_front(b);
  }
}

void BlockPool::move_to_front(BlockId b) {
  if (!is_free(b)) return;
  unlink(b);
  push_front(b);
}

std::vector<BlockId> BlockPool::free_list() const {
  std::vector<BlockId> out;
  out.reserve(static_cast<std::size_t>(num_free_));
  for (BlockId b = head_; b != kNoBlock; b = nodes_[b].next) out.push_back(b);
  return out;
}

std::string BlockPool::check_integrity() const {
  std::int32_t count = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = head_; b != kNoBlock; b = nodes_[b].next) {
    if (++count > num_blocks()) return "free list has a cycle";
    if (nodes_[b].prev != prev) return "free list: bad prev link at block " + std::to_string(b);
    if (nodes_[b].ref_count != 0) return "free list holds referenced block " + std::to_string(b);
    prev = b;
  }
  if (prev != tail_) return "free list: tail does not match the last node";
  if (count != num_free_) {
    return "free count " + std::to_string(num_free_) + " but list length " + std::to_string(count);
  }
  std::int32_t zero = 0;
  for (const Node& n : nodes_) {
    if (n.ref_count < 0) return "negative refcount";
    zero += n.ref_count == 0;
  }
  if (zero != num_free_) return "blocks with refcount 0 are not all on the free list";
  return {};
}

void BlockPool::unlink(BlockId b) {
  Node& n = nodes_[b];
  (n.prev == kNoBlock ? head_ : nodes_[n.prev].next) = n.next;
  (n.next == kNoBlock ? tail_ : nodes_[n.next].prev) = n.prev;
  n.prev = n.next = kNoBlock;
  --num_free_;
}

void BlockPool::push_front(BlockId b) {
  Node& n = nodes_[b];
  n.prev = kNoBlock;
  n.next = head_;
  (head_ == kNoBlock ? tail_ : nodes_[head_].prev) = b;
  head_ = b;
  ++num_free_;
}

void BlockPool::push_back(BlockId b) {
  Node& n = nodes_[b];
  n.next = kNoBlock;
  n.prev = tail_;
  (tail_ == kNoBlock ? head_ : nodes_[tail_].next) = b;
  tail_ = b;
  ++num_free_;
}

}  // namespace kvfleet
