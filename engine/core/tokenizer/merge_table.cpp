// Building the open-addressing merge table (lookups are inline in parts.h).
#include "engine/core/tokenizer/parts.h"

namespace kvfleet::tok {

MergeTable::MergeTable(std::size_t expected) {
  std::size_t capacity = 16;
  while (capacity < expected * 2) capacity *= 2;  // load factor <= 0.5 keeps probe runs short
  entries_.assign(capacity, Entry{});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
}

void MergeTable::grow() {
  std::vector<Entry> old = std::move(entries_);
  *this = MergeTable(old.size());  // doubles: capacity >= 2 * old capacity
  for (const Entry& e : old) {
    if (e.key != kEmpty) insert(static_cast<TokenId>(e.key >> 32), static_cast<TokenId>(e.key & 0xFFFFFFFFu), e.merge);
  }
}

void MergeTable::insert(TokenId left, TokenId right, Merge merge) {
  if ((size_ + 1) * 2 > entries_.size()) grow();
  const std::uint64_t key = pack(left, right);
  for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
    Entry& e = entries_[i];
    if (e.key == key) return;
    if (e.key == kEmpty) {
      e = {key, merge};
      ++size_;
      return;
    }
  }
}

}  // namespace kvfleet::tok
