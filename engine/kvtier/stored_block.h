// StoredBlock: one KV block as the tiers below the device pool keep it: its chained hash and parent
// (Contract 1), its tokens (compared on every hit, as the prefix cache does, so a 64-bit collision never
// hands out another prompt's K/V), and its bytes: every layer, layer after layer, each K then V in the
// backend's KV dtype (Backend::read_kv_blocks, the layout of Contract 5). Immutable once made; shared
// between tiers (a block on its way to disk is the same object the host tier holds).
//
// The bytes come from a BlockBuffers pool and go back to it when the last holder lets go: a fresh
// allocation of a block-sized buffer is an mmap whose every page faults on first touch, which made copies
// run at 0.3 GB/s instead of memcpy speed (bench_kv_tiers). Pooled buffers are touched once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::kvtier {

class BlockBytes {
 public:
  BlockBytes() = default;
  BlockBytes(std::shared_ptr<std::byte[]> buffer, std::size_t size) : buffer_(std::move(buffer)), size_(size) {}
  // A buffer of its own (tests, one-offs), zeroed.
  static BlockBytes allocate(std::size_t size) { return {std::make_shared<std::byte[]>(size), size}; }

  std::byte* data() { return buffer_.get(); }
  const std::byte* data() const { return buffer_.get(); }
  std::size_t size() const { return size_; }
  std::span<const std::byte> span() const { return {data(), size_}; }
  std::byte& operator[](std::size_t i) { return buffer_[i]; }
  bool operator==(const BlockBytes& other) const { return std::ranges::equal(span(), other.span()); }

 private:
  std::shared_ptr<std::byte[]> buffer_;
  std::size_t size_ = 0;
};

// Buffers of one size, reused. take() from any thread; a buffer goes back to the pool from whichever thread
// drops its last reference. Memory is kept until the pool and all its buffers are gone.
class BlockBuffers : public std::enable_shared_from_this<BlockBuffers> {
 public:
  static std::shared_ptr<BlockBuffers> make(std::size_t size) { return std::shared_ptr<BlockBuffers>(new BlockBuffers(size)); }
  ~BlockBuffers() {
    for (std::byte* p : free_) ::operator delete[](p, std::align_val_t{64});
  }

  BlockBytes take() {
    std::byte* p = nullptr;
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        p = free_.back();
        free_.pop_back();
      }
    }
    if (p == nullptr) p = static_cast<std::byte*>(::operator new[](size_, std::align_val_t{64}));
    auto self = shared_from_this();
    return {std::shared_ptr<std::byte[]>(p, [self](std::byte* q) { self->give_back(q); }), size_};
  }
  std::size_t size() const { return size_; }

 private:
  explicit BlockBuffers(std::size_t size) : size_(size) {}
  void give_back(std::byte* p) {
    std::lock_guard lock(mu_);
    free_.push_back(p);
  }

  const std::size_t size_;
  std::mutex mu_;
  std::vector<std::byte*> free_;  // guarded by mu_
};

struct StoredBlock {
  BlockHash hash = 0;
  BlockHash parent = 0;
  std::vector<TokenId> tokens;
  BlockBytes bytes;

  bool holds(std::span<const TokenId> want) const { return std::ranges::equal(tokens, want); }
  std::size_t footprint() const { return bytes.size() + tokens.size() * sizeof(TokenId) + sizeof(StoredBlock); }
};

using StoredBlockPtr = std::shared_ptr<const StoredBlock>;

}  // namespace kvfleet::kvtier
