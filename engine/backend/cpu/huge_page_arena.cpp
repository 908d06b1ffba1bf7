#include "engine/backend/cpu/huge_page_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string_view>

namespace kvfleet::cpu {
namespace {

constexpr std::size_t kPage = 4096;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

HugePageArena::HugePageArena() {
  const char* env = std::getenv("KVFLEET_CPU_HUGEPAGES");
  huge_ = !(env && std::string_view(env) == "0");
}

HugePageArena::~HugePageArena() {
  for (auto [p, n] : maps_) ::munmap(p, n);
}

// Reserves 2 MiB more than asked, keeps the 2 MiB-aligned part and unmaps the rest.
std::byte* HugePageArena::map(std::size_t bytes) {
  const std::size_t reserve = bytes + kHugePage;
  void* raw = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto begin = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(begin, kHugePage), end = begin + reserve;
  if (aligned > begin) ::munmap(raw, aligned - begin);
  if (end > aligned + bytes) ::munmap(reinterpret_cast<void*>(aligned + bytes), end - (aligned + bytes));
  auto* p = reinterpret_cast<std::byte*>(aligned);
  maps_.emplace_back(p, bytes);
  if (huge_) ::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without THP the pages are small, nothing else changes
  return p;
}

std::byte* HugePageArena::take(std::size_t bytes) {
  bytes = round_up(bytes == 0 ? 1 : bytes, 64);
  if (bytes >= kOwnMapping) return map(round_up(bytes, kPage));
  // First fit: the oldest region with room (a region's tail, too short for the piece that opened the next
  // region, still takes smaller ones asked for later).
  auto it = std::find_if(regions_.begin(), regions_.end(), [&](const Region& r) { return r.left >= bytes; });
  if (it == regions_.end()) it = regions_.insert(regions_.end(), Region{map(kRegion), kRegion});
  std::byte* p = it->next;
  it->next += bytes;
  it->left -= bytes;
  return p;
}

}  // namespace kvfleet::cpu
