// FileTier: the index of one directory of block files (block_file.h): the disk tier (this replica's own
// directory: a byte bound, least recently used files deleted first, its index rebuilt from the directory at
// start, oldest file first, so a restarted replica finds its blocks again) or the shared tier (a directory
// several replicas write: no replica deletes from it, so its size is the operator's to bound; a lookup asks
// the file system, since other replicas add files). The shared tier's index holds at most `max_entries`
// blocks, least recently used forgotten first (their files stay; a later lookup finds them again).
// The index is the engine thread's alone; the file I/O itself runs on KvTiers' I/O threads, which report
// back through KvTiers, so this class does no I/O except the start-up scan and, for the shared tier, stat().
#pragma once

#include <cstdint>
#include <filesystem>
#include <list>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/kvtier/block_file.h"

namespace kvfleet::kvtier {

class FileTier {
 public:
  // Creates dir/<compat> if needed; throws std::runtime_error naming the directory when it cannot.
  // max_bytes 0: no byte bound and nothing deleted (the shared tier), its index bounded by max_entries instead.
  FileTier(KvMedium medium, const std::filesystem::path& dir, const BlockFileFormat& format, std::uint64_t max_bytes,
           std::size_t max_entries = 0);

  KvMedium medium() const { return medium_; }
  const std::filesystem::path& folder() const { return folder_; }
  const BlockFileFormat& format() const { return format_; }

  // Whether a lookup should read the block's file (the disk tier marks it used).
  bool may_hold(BlockHash hash);
  // Whether the block should be written: false when the tier holds it or is writing it. Otherwise reserves
  // its place; over the bound, the least recently used blocks are dropped from the index and appended to
  // `doomed` (the caller deletes their files).
  bool want_write(BlockHash hash, std::vector<BlockHash>& doomed);
  // A write finished; a failed one gives its place back.
  void wrote(BlockHash hash, bool ok);
  // The block's file turned out missing or unusable: no lookup reads it again.
  void forget(BlockHash hash);

  std::uint64_t bytes() const { return static_cast<std::uint64_t>(index_.size()) * format_.file_bytes(); }
  std::size_t blocks() const { return index_.size(); }
  // The blocks whose files are in place (not those being written), most recently used first.
  std::vector<BlockHash> held() const;

 private:
  struct Entry {
    BlockHash hash;
    bool written;  // false while its write is in flight
  };
  void scan();
  void forget_oldest();  // shared: over max_entries_, the least recently used written blocks leave the index

  const KvMedium medium_;
  const std::filesystem::path folder_;
  const BlockFileFormat format_;
  const std::uint64_t max_bytes_;
  const std::size_t max_entries_;
  // Disk: every block, most recently used first. Shared: the blocks this replica wrote or found.
  std::list<Entry> lru_;
  std::unordered_map<BlockHash, std::list<Entry>::iterator> index_;
};

}  // namespace kvfleet::kvtier
