// Block files: what is written reads back bit for bit; every kind of damage is a miss with its reason.
#include <doctest/doctest.h>

#include <fstream>

#include "engine/kvtier/block_file.h"
#include "support/temp_dir.h"

using namespace kvfleet;
using namespace kvfleet::kvtier;
namespace fs = std::filesystem;

namespace {

constexpr BlockFileFormat kFormat{0x1234, 4, 64};

StoredBlock sample_block(BlockHash hash = 0xabcdef) {
  StoredBlock b;
  b.hash = hash;
  b.parent = 0x42;
  b.tokens = {1, 2, 3, 4};
  b.bytes = BlockBytes::allocate(kFormat.payload_bytes);
  for (std::size_t i = 0; i < b.bytes.size(); ++i) b.bytes[i] = static_cast<std::byte>(i * 3 + 1);
  return b;
}

void patch(const fs::path& file, std::size_t offset, char value) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(value);
}

}  // namespace

TEST_CASE("a block file reads back the block that was written") {
  test::TempDir dir;
  const fs::path folder = block_folder(dir.path(), kFormat.compat);
  fs::create_directories(folder);
  const StoredBlock b = sample_block();
  CHECK(write_block_file(folder, kFormat, b).empty());
  CHECK(fs::file_size(block_file(folder, b.hash)) == kFormat.file_bytes());
  CHECK(block_file(folder, b.hash).filename() == "0000000000abcdef.kvblock");
  CHECK(block_folder(dir.path(), kFormat.compat).filename() == "0000000000001234");
  const BlockFileRead r = read_block_file(folder, kFormat, b.hash);
  REQUIRE(r.block);
  CHECK_FALSE(r.error);
  CHECK(r.block->hash == b.hash);
  CHECK(r.block->parent == b.parent);
  CHECK(r.block->tokens == b.tokens);
  CHECK(r.block->bytes == b.bytes);
  // No temporary file is left behind.
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(folder)) ++files;
  CHECK(files == 1);
}

TEST_CASE("a missing block file is a plain miss") {
  test::TempDir dir;
  const BlockFileRead r = read_block_file(dir.path(), kFormat, 7);
  CHECK_FALSE(r.block);
  CHECK_FALSE(r.error);
}

TEST_CASE("truncated, corrupt and foreign block files are misses with their reason") {
  test::TempDir dir;
  const fs::path folder = dir.path();
  const StoredBlock b = sample_block();
  const fs::path file = block_file(folder, b.hash);
  const auto fresh = [&] { REQUIRE(write_block_file(folder, kFormat, b).empty()); };
  const auto error_of = [&](const BlockFileFormat& format = kFormat) {
    const BlockFileRead r = read_block_file(folder, format, b.hash);
    CHECK_FALSE(r.block);
    return r.error;
  };

  fresh();
  fs::resize_file(file, kFormat.file_bytes() - 1);  // the last payload byte is gone
  CHECK(error_of() == KvTierError::truncated);
  fs::resize_file(file, 10);  // not even a header
  CHECK(error_of() == KvTierError::truncated);

  fresh();
  patch(file, kFormat.file_bytes() - 5, 0x7f);  // a payload byte flipped
  CHECK(error_of() == KvTierError::corrupt);
  fresh();
  patch(file, kBlockFileHeaderBytes + 1, 0x7f);  // a token byte flipped
  CHECK(error_of() == KvTierError::corrupt);
  fresh();
  {
    std::ofstream f(file, std::ios::app | std::ios::binary);
    f.put('x');  // one byte too many
  }
  CHECK(error_of() == KvTierError::corrupt);

  fresh();
  CHECK(error_of({0x9999, 4, 64}) == KvTierError::foreign);  // another model's or dtype's block
  CHECK(error_of({0x1234, 8, 64}) == KvTierError::foreign);  // another block size
  patch(file, 0, 'X');  // not a block file
  CHECK(error_of() == KvTierError::foreign);
  fresh();
  fs::copy_file(file, block_file(folder, 0x777));  // a file under another block's name
  const BlockFileRead other = read_block_file(folder, kFormat, 0x777);
  CHECK_FALSE(other.block);
  CHECK(other.error == KvTierError::foreign);

  fresh();
  CHECK(read_block_file(folder, kFormat, b.hash).block);  // rewritten whole, it is good again
}

TEST_CASE("only block file names give a hash") {
  CHECK(block_file_hash("0000000000abcdef.kvblock") == BlockHash{0xabcdef});
  CHECK_FALSE(block_file_hash(".0000000000abcdef.12.0.tmp"));
  CHECK_FALSE(block_file_hash("0000000000abcdeg.kvblock"));
  CHECK_FALSE(block_file_hash("abcdef.kvblock"));
}
