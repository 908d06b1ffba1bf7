// BlockPool: the fixed set of KV blocks, their reference counts, and the free list.
//
// The free list is one intrusive doubly-linked list over block ids (vLLM's FreeKVCacheBlockQueue):
// allocation pops the head, a cache hit on a free block revives it by unlinking it from the middle
// in O(1). Free blocks that hold no cached content sit at the front (they are worth nothing, so
// they go first); free blocks that still hold cached content sit behind them in LRU order, the least
// recently freed first. A request's blocks are released tail first, so the tail of a prompt (useless
// without its parent blocks) is evicted before its head.
//
// The pool knows nothing about hashes: the caller says, when a block's last reference goes, whether
// it still holds cached content. Engine thread only, like everything in engine/kv.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvfleet {

using BlockId = std::int32_t;
inline constexpr BlockId kNoBlock = -1;

class BlockPool {
 public:
  // Every block starts free and uncached; the free list holds them in id order, 0 first.
  explicit BlockPool(std::int32_t num_blocks);

  std::int32_t num_blocks() const { return static_cast<std::int32_t>(nodes_.size()); }
  std::int32_t num_free() const { return num_free_; }
  std::int32_t ref_count(BlockId b) const { return nodes_[b].ref_count; }
  bool is_free(BlockId b) const { return nodes_[b].ref_count == 0; }

  // The block the next pop_free() returns (kNoBlock when none is free).
  BlockId peek_free() const { return head_; }
  // Takes the free list's head with one reference. Precondition: num_free() > 0. The caller drops
  // whatever cached content the block held.
  BlockId pop_free();
  // One more reference; a free block (a cache hit) is unlinked from the free list.
  void acquire(BlockId b);
  // One reference less; at zero the block joins the free list: at the back (most recently used)
  // when `cached`, at the front otherwise.
  void release(BlockId b, bool cached);
  // A free block lost its cached content (the prefix cache was reset): move it to the front.
  void move_to_front(BlockId b);

  // Head (next to be allocated) to tail. For tests and integrity checks.
  std::vector<BlockId> free_list() const;
  // Empty when the links, the free count and the refcounts agree; otherwise what is wrong.
  std::string check_integrity() const;

 private:
  struct Node {
    std::int32_t ref_count = 0;
    BlockId prev = kNoBlock;
    BlockId next = kNoBlock;
  };
  void unlink(BlockId b);
  void push_front(BlockId b);
  void push_back(BlockId b);

  std::vector<Node> nodes_;
  BlockId head_ = kNoBlock;
  BlockId tail_ = kNoBlock;
  std::int32_t num_free_ = 0;
};

}  // namespace kvfleet
