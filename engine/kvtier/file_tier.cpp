#include "engine/kvtier/file_tier.h"

#include <algorithm>
#include <stdexcept>

namespace kvfleet::kvtier {

namespace fs = std::filesystem;

FileTier::FileTier(KvMedium medium, const fs::path& dir, const BlockFileFormat& format, std::uint64_t max_bytes,
                   std::size_t max_entries)
    : medium_(medium), folder_(block_folder(dir, format.compat)), format_(format), max_bytes_(max_bytes),
      max_entries_(max_entries) {
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (ec || !fs::is_directory(folder_))
    throw std::runtime_error(std::string(to_string(medium)) + " KV tier: cannot use " + folder_.string() + ": " + ec.message());
  if (max_bytes_ > 0) scan();
}

// The disk tier's files, oldest first into the LRU (so the oldest go first); leftovers of writes that never
// finished (a kill during a write) are deleted.
void FileTier::scan() {
  std::vector<std::pair<fs::file_time_type, BlockHash>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".") && name.ends_with(".tmp")) {
      fs::remove(e.path(), ec);
      continue;
    }
    const auto hash = block_file_hash(name);
    if (!hash) continue;
    found.emplace_back(e.last_write_time(ec), *hash);
  }
  std::sort(found.begin(), found.end());
  std::vector<BlockHash> doomed;
  for (const auto& [time, hash] : found) {
    if (!want_write(hash, doomed)) continue;
    wrote(hash, true);
  }
  for (const BlockHash h : doomed) fs::remove(block_file(folder_, h), ec);  // a smaller bound than last time
}

bool FileTier::may_hold(BlockHash hash) {
  const auto it = index_.find(hash);
  if (max_bytes_ == 0) {  // shared: other replicas add files
    if (it != index_.end()) {
      if (!it->second->written) return false;
      lru_.splice(lru_.begin(), lru_, it->second);
      return true;
    }
    std::error_code ec;
    if (!fs::exists(block_file(folder_, hash), ec)) return false;
    lru_.push_front({hash, true});
    index_.emplace(hash, lru_.begin());
    forget_oldest();
    return true;
  }
  if (it == index_.end() || !it->second->written) return false;
  lru_.splice(lru_.begin(), lru_, it->second);
  return true;
}

bool FileTier::want_write(BlockHash hash, std::vector<BlockHash>& doomed) {
  if (index_.contains(hash)) return false;
  lru_.push_front({hash, false});
  index_.emplace(hash, lru_.begin());
  if (max_bytes_ == 0) {
    forget_oldest();
    return true;
  }
  while (bytes() > max_bytes_ && lru_.size() > 1) {
    const Entry& victim = lru_.back();
    if (!victim.written) break;  // in flight: dropped once written, if still the oldest
    doomed.push_back(victim.hash);
    index_.erase(victim.hash);
    lru_.pop_back();
  }
  if (bytes() > max_bytes_) {  // the bound holds less than one block
    forget(hash);
    return false;
  }
  return true;
}

void FileTier::forget_oldest() {
  if (max_entries_ == 0) return;
  // From the back, past writes in flight (they stay until written: the index is what stops a second write).
  for (auto it = lru_.end(); index_.size() > max_entries_ && it != lru_.begin();) {
    --it;
    if (!it->written) continue;
    index_.erase(it->hash);
    it = lru_.erase(it);
  }
}

void FileTier::wrote(BlockHash hash, bool ok) {
  const auto it = index_.find(hash);
  if (it == index_.end()) return;
  if (ok) {
    it->second->written = true;
  } else {
    forget(hash);
  }
}

void FileTier::forget(BlockHash hash) {
  const auto it = index_.find(hash);
  if (it == index_.end()) return;
  lru_.erase(it->second);
  index_.erase(it);
}

std::vector<BlockHash> FileTier::held() const {
  std::vector<BlockHash> out;
  out.reserve(lru_.size());
  for (const Entry& e : lru_)
    if (e.written) out.push_back(e.hash);
  return out;
}

}  // namespace kvfleet::kvtier
