// SectionCache: exact results for whole text sections (the text between two added/special tokens).
//
// A section's ids depend only on its bytes and on whether it starts the input (the pre-tokenizer's
// first_section flag): normalization, pre-tokenization and BPE see nothing else. So a chat prompt's
// system message, which a chat template puts between the same special tokens in every request,
// tokenizes to the same ids every time, and the cache returns them without redoing the work.
//
// Exactness: the key is the full section text plus the flag; a 64-bit hash only finds the slot and a
// hit compares the stored text byte for byte. Admission: a section is stored only when it was seen
// before (a small ring of recent hashes), so one-off user messages do not push out the recurring
// ones. Bounds: sections of at least kMinBytes (shorter ones are cheap to tokenize), at most
// max_bytes of text + ids in all; when full, the least recently used entry goes.
//
// Threading: thread-safe (one mutex; the tokenization itself runs outside it).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvfleet/block_hash.h"  // TokenId

namespace kvfleet::tok {

class SectionCache {
 public:
  static constexpr std::size_t kMinBytes = 256;
  explicit SectionCache(std::size_t max_bytes = 16u << 20) : max_bytes_(max_bytes) {}

  // Appends the cached ids of (text, first) to `out` and returns true; false on a miss.
  bool find(std::string_view text, bool first, std::vector<TokenId>& out);
  // Offers the ids that (text, first) tokenized to; kept if seen before and small enough.
  void offer(std::string_view text, bool first, const TokenId* ids, std::size_t count);

 private:
  struct Entry {
    std::string text;
    bool first = false;
    std::vector<TokenId> ids;
    std::uint64_t last_used = 0;
  };
  static std::uint64_t key_of(std::string_view text, bool first);
  std::size_t cost(const Entry& e) const { return e.text.size() + e.ids.size() * sizeof(TokenId) + 64; }
  void evict_until_fits(std::size_t incoming);

  const std::size_t max_bytes_;
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, Entry> entries_;
  std::size_t bytes_ = 0;
  std::uint64_t clock_ = 0;
  std::array<std::uint64_t, 1024> seen_{};  // hashes of recent misses (0: empty)
  std::size_t seen_next_ = 0;
};

}  // namespace kvfleet::tok
