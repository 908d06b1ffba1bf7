// Memory the CPU backend streams, on 2 MiB pages where the kernel gives them: the packed weights, and the
// KV cache with K's transposed copy.
//
// A batch-1 decode step streams every weight once, and a batched one reads every sequence's KV blocks. On
// 4 KiB pages that is a TLB miss every 4 KiB, and in a VM (nested paging) each miss walks two page tables.
// The arena asks for transparent huge pages (madvise MADV_HUGEPAGE: used when THP is "madvise" or
// "always", ignored when it is "never") on mappings aligned to 2 MiB. Measured on the AMD Zen 4 VM
// (docs/cpu_backend.md): a 125M token's linear calls 1.05-1.25x at 2 threads and
// 1.09-1.26x at 1; decode attention of 32 sequences x 512 keys 1.03-1.13x.
//
// A huge page only backs 2 MiB of address space, aligned, that lies inside one mapping, and it is backed
// whole as soon as one byte of it is touched. So:
//   - a piece under kOwnMapping (most weights of a small model) goes in the first kRegion mapping with room
//     for it (first fit: a region's tail, too short for one piece, takes smaller ones asked for later);
//     only the regions' last tails are waste, and of those only what lies in a 2 MiB page that was touched;
//   - a larger piece gets a mapping of its own, its size rounded up to 4 KiB only: its partial 2 MiB at
//     the end stays on small pages.
// Pointers are 64-byte aligned and stay valid until the arena is destroyed; nothing is freed before.
// Not thread-safe (the backend packs and allocates on the engine thread).
// KVFLEET_CPU_HUGEPAGES=0: no madvise (A/B runs).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace kvfleet::cpu {

class HugePageArena {
 public:
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;
  static constexpr std::size_t kRegion = std::size_t{32} << 20;
  static constexpr std::size_t kOwnMapping = std::size_t{4} << 20;

  HugePageArena();
  ~HugePageArena();
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;

  // `bytes` of memory, 64-byte aligned, reading as zero (pages no one has touched yet: nothing is reused).
  // Throws std::bad_alloc when the system has none.
  std::byte* take(std::size_t bytes);

  bool huge_pages() const { return huge_; }  // whether the mappings are madvised
  const std::vector<std::pair<std::byte*, std::size_t>>& mappings() const { return maps_; }

 private:
  std::byte* map(std::size_t bytes);  // a new mapping of `bytes` (a multiple of 4 KiB), 2 MiB aligned

  bool huge_;
  std::vector<std::pair<std::byte*, std::size_t>> maps_;
  struct Region {
    std::byte* next;  // the free part's start
    std::size_t left;
  };
  std::vector<Region> regions_;  // the kRegion mappings that small weights share
};

}  // namespace kvfleet::cpu
