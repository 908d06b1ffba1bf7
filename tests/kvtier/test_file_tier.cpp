// FileTier's shared index: bounded, least recently used forgotten first, a forgotten block found again in the
// directory, and a write in flight never forgotten (so a block is not written twice at once).
#include <doctest/doctest.h>

#include <fstream>

#include "engine/kvtier/file_tier.h"
#include "support/temp_dir.h"

using namespace kvfleet;
using namespace kvfleet::kvtier;
namespace fs = std::filesystem;

namespace {

constexpr BlockFileFormat kFormat{0x5678, 4, 64};

// What another replica's write leaves: the block's file in place (a lookup only asks whether it exists).
void place_file(const FileTier& tier, BlockHash hash) { std::ofstream(block_file(tier.folder(), hash)) << "x"; }

}  // namespace

TEST_CASE("shared tier: the index keeps the most recently used blocks; a forgotten one is found again") {
  test::TempDir dir;
  FileTier tier(KvMedium::shared, dir.path(), kFormat, 0, 3);
  std::vector<BlockHash> doomed;
  for (BlockHash h = 1; h <= 5; ++h) {
    REQUIRE(tier.want_write(h, doomed));
    tier.wrote(h, true);
    place_file(tier, h);
  }
  CHECK(doomed.empty());  // nothing is deleted from a shared directory
  CHECK(tier.blocks() == 3);
  CHECK(tier.held() == std::vector<BlockHash>{5, 4, 3});
  // A lookup of a forgotten block asks the directory, finds the file and remembers it again.
  CHECK(tier.may_hold(1));
  CHECK(tier.held() == std::vector<BlockHash>{1, 5, 4});
  // A hit moves a block to the front, so the next one forgotten is the least recently used.
  CHECK(tier.may_hold(4));
  place_file(tier, 6);
  CHECK(tier.may_hold(6));
  CHECK(tier.held() == std::vector<BlockHash>{6, 4, 1});
  CHECK_FALSE(tier.may_hold(99));  // no file, no entry
  CHECK(tier.blocks() == 3);
}

TEST_CASE("shared tier: writes in flight stay in the index past its bound") {
  test::TempDir dir;
  FileTier tier(KvMedium::shared, dir.path(), kFormat, 0, 2);
  std::vector<BlockHash> doomed;
  for (BlockHash h = 10; h < 14; ++h) REQUIRE(tier.want_write(h, doomed));
  CHECK(tier.blocks() == 4);  // all four in flight
  for (BlockHash h = 10; h < 14; ++h) CHECK_FALSE(tier.want_write(h, doomed));  // never a second write at once
  for (BlockHash h = 10; h < 14; ++h) tier.wrote(h, true);
  REQUIRE(tier.want_write(20, doomed));  // the next insertion trims the written ones
  CHECK(tier.blocks() == 2);
  CHECK(tier.held() == std::vector<BlockHash>{13});  // 20 is in flight, so only 13 is held
}
