// The CPU backend's arena for the memory it streams (engine/backend/cpu/huge_page_arena.h): aligned, disjoint,
// writable pieces; small weights share a region, large ones get a mapping of their own; every mapping is
// 2 MiB aligned and, unless KVFLEET_CPU_HUGEPAGES=0, eligible for transparent huge pages.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend/cpu/huge_page_arena.h"

using kvfleet::cpu::HugePageArena;

namespace {

// The THPeligible field of the mapping (VMA) in /proc/self/smaps that holds `p`; -1 if not found.
int thp_eligible(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    std::uintptr_t b = 0, e = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> b >> dash >> e && dash == '-' && line.find(':') > line.find(' ')) {
      inside = at >= b && at < e;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

bool thp_never() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s.empty() || s.find("[never]") != std::string::npos;
}

}  // namespace

TEST_CASE("huge page arena: aligned, disjoint pieces; small ones share a region, large ones map alone") {
  HugePageArena arena;
  std::vector<std::pair<std::byte*, std::size_t>> got;
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{393216}, std::size_t{1179648}, std::size_t{65}}) {
    std::byte* p = arena.take(n);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    std::memset(p, 0x5a, n);
    got.emplace_back(p, n);
  }
  CHECK(arena.mappings().size() == 1);  // all five in the first region
  // In order, each after the last one's (64-byte-rounded) end.
  for (std::size_t i = 1; i < got.size(); ++i)
    CHECK(got[i].first == got[i - 1].first + (got[i - 1].second + 63) / 64 * 64);

  // A large weight: a mapping of its own, rounded to 4 KiB only.
  const std::size_t big = HugePageArena::kOwnMapping + 12345;
  std::byte* b = arena.take(big);
  std::memset(b, 0x33, big);
  REQUIRE(arena.mappings().size() == 2);
  CHECK(arena.mappings()[1].first == b);
  CHECK(arena.mappings()[1].second == (big + 4095) / 4096 * 4096);

  // Small weights keep filling the first region (the large mapping did not take its place) until one no
  // longer fits in its rest: that one starts a new region.
  std::size_t used = 0;
  for (const auto& [p, n] : got) used += (n + 63) / 64 * 64;
  const std::size_t piece = std::size_t{3} << 20;
  std::byte* last = got.back().first;
  for (std::size_t left = HugePageArena::kRegion - used; left >= piece; left -= piece) {
    std::byte* p = arena.take(piece);
    CHECK(p == got.front().first + (HugePageArena::kRegion - left));
    last = p;
  }
  CHECK(arena.mappings().size() == 2);
  std::byte* next = arena.take(piece);
  REQUIRE(arena.mappings().size() == 3);
  CHECK(arena.mappings().back().first == next);
  CHECK(arena.mappings().back().second == HugePageArena::kRegion);
  CHECK(last + piece <= got.front().first + HugePageArena::kRegion);
  // First fit: a piece that fits in the first region's tail goes there, not after `next`.
  const std::size_t tail = (HugePageArena::kRegion - used) % piece;
  REQUIRE(tail >= 4096);
  CHECK(arena.take(tail) == got.front().first + (HugePageArena::kRegion - tail));  // fills it
  CHECK(arena.take(64) == next + piece);                                           // the first region is full

  for (const auto& [p, n] : arena.mappings()) CHECK(reinterpret_cast<std::uintptr_t>(p) % HugePageArena::kHugePage == 0);
  // Nothing overwrote anything: the first pieces still hold their bytes.
  for (const auto& [p, n] : got) CHECK(std::all_of(p, p + n, [](std::byte c) { return c == std::byte{0x5a}; }));
  CHECK(std::all_of(b, b + big, [](std::byte c) { return c == std::byte{0x33}; }));
}

TEST_CASE("huge page arena: mappings are eligible for transparent huge pages unless turned off") {
  if (thp_never()) {
    MESSAGE("transparent huge pages are off on this machine: only the switch is checked");
  }
  const char* env = std::getenv("KVFLEET_CPU_HUGEPAGES");
  const std::string saved = env ? env : "";
  ::unsetenv("KVFLEET_CPU_HUGEPAGES");
  {
    HugePageArena arena;
    CHECK(arena.huge_pages());
    std::byte* p = arena.take(1000);
    std::memset(p, 1, 1000);
    if (!thp_never()) CHECK(thp_eligible(p) == 1);
  }
  ::setenv("KVFLEET_CPU_HUGEPAGES", "0", 1);
  {
    HugePageArena arena;
    CHECK_FALSE(arena.huge_pages());
  }
  if (env) ::setenv("KVFLEET_CPU_HUGEPAGES", saved.c_str(), 1);
  else ::unsetenv("KVFLEET_CPU_HUGEPAGES");
}
