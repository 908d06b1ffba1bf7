#include "engine/core/tokenizer/section_cache.h"

#include <algorithm>
#include <xxhash.h>

namespace kvfleet::tok {

std::uint64_t SectionCache::key_of(std::string_view text, bool first) {
  const std::uint64_t h = XXH3_64bits_withSeed(text.data(), text.size(), first ? 1 : 2);
  return h == 0 ? 1 : h;  // 0 marks an empty slot of seen_
}

bool SectionCache::find(std::string_view text, bool first, std::vector<TokenId>& out) {
  if (text.size() < kMinBytes) return false;
  const std::uint64_t key = key_of(text, first);
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(key);
  if (it == entries_.end() || it->second.first != first || it->second.text != text) return false;
  it->second.last_used = ++clock_;
  out.insert(out.end(), it->second.ids.begin(), it->second.ids.end());
  return true;
}

void SectionCache::offer(std::string_view text, bool first, const TokenId* ids, std::size_t count) {
  if (text.size() < kMinBytes) return;
  const std::uint64_t key = key_of(text, first);
  std::lock_guard lock(mutex_);
  if (std::find(seen_.begin(), seen_.end(), key) == seen_.end()) {  // first sighting: remember only the hash
    seen_[seen_next_] = key;
    seen_next_ = (seen_next_ + 1) % seen_.size();
    return;
  }
  Entry entry{std::string(text), first, std::vector<TokenId>(ids, ids + count), ++clock_};
  if (cost(entry) > max_bytes_) return;
  if (const auto it = entries_.find(key); it != entries_.end()) {  // a hash collision: the newer one wins
    bytes_ -= cost(it->second);
    entries_.erase(it);
  }
  evict_until_fits(cost(entry));
  bytes_ += cost(entry);
  entries_.emplace(key, std::move(entry));
}

// Few, large entries (whole system prompts), so a linear scan for the oldest is cheap enough.
void SectionCache::evict_until_fits(std::size_t incoming) {
  while (!entries_.empty() && bytes_ + incoming > max_bytes_) {
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    bytes_ -= cost(oldest->second);
    entries_.erase(oldest);
  }
}

}  // namespace kvfleet::tok
