#include <doctest/doctest.h>

#include <fstream>
#include <future>
#include <vector>

#include "engine/kvtier/tier_identity.h"
#include "support/temp_dir.h"

using namespace kvfleet;
using namespace kvfleet::test;
namespace fs = std::filesystem;

TEST_CASE("a shared tier's folder has one identity for every reader, created once, even by racing readers") {
  TempDir one, two;
  std::vector<std::future<std::uint64_t>> racing;
  for (int i = 0; i < 8; ++i) racing.push_back(std::async(std::launch::async, [&] { return kvtier::folder_identity(one.path()); }));
  const std::uint64_t id = kvtier::folder_identity(one.path());
  CHECK(id != 0);
  for (auto& f : racing) CHECK(f.get() == id);
  CHECK(kvtier::folder_identity(one.path()) == id);  // read back, not made again
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(one.path())) ++files;
  CHECK(files == 1);  // .tier-id; no temporary file left
  CHECK(kvtier::folder_identity(two.path()) != id);
  std::ofstream(two.path() / ".tier-id", std::ios::trunc) << "00000000000000ab\n";  // another replica's
  CHECK(kvtier::folder_identity(two.path()) == 0xab);
  CHECK(kvtier::folder_identity(two.path() / "missing") == 0);  // nowhere to keep it
}
