// The BPE model: merges by rank over token ids.
//
// A word starts as one symbol per byte (byte-level vocabularies: the vocab is re-keyed by the raw
// bytes each GPT-2 character stands for) or per UTF-8 character (SentencePiece vocabularies; a
// character missing from the vocab becomes <0xNN> byte tokens with byte_fallback, else <unk>). Then
// the adjacent pair with the lowest merge rank, leftmost on ties, is merged until no pair has a rank.
// Short words scan an array of pair ranks (fewer hash lookups, no allocation churn); long words use
// a heap over a linked list so a megabyte without a space stays O(n log n).
#include "engine/core/tokenizer/parts.h"

#include <algorithm>
#include <cstdio>
#include <queue>

namespace kvfleet::tok {
namespace {

constexpr std::uint32_t kNoRank = UINT32_MAX;
constexpr std::size_t kHeapThreshold = 48;       // symbols; above this the heap variant runs
constexpr std::size_t kMaxCachedWord = 64;       // bytes
constexpr std::size_t kCacheShards = 16;
constexpr std::size_t kCacheEntriesPerShard = 8192;

using Symbol = BpeModel::Symbol;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Code point of the character that ends right before byte `p` of s.
char32_t char_before(std::string_view s, std::size_t p) {
  std::size_t start = p - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  std::size_t len;
  return utf8_decode(s, start, len);
}

}  // namespace

// Per-word results, sharded so that concurrent encoders rarely meet on one lock. A full shard is
// simply cleared: cheap, bounded, and good enough for the Zipf-like distribution of words.
struct BpeModel::Cache {
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> map;
  };
  std::array<Shard, kCacheShards> shards;
  Shard& shard_for(std::string_view word) { return shards[StringHash{}(word) % kCacheShards]; }
};

BpeModel::BpeModel(const std::vector<std::pair<std::string, TokenId>>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : options_(options), split_words_(!options.byte_level), cache_(std::make_unique<Cache>()) {
  vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab) {
    std::string key = model_key(token);
    if (!key.empty() || token.empty()) vocab_.emplace(std::move(key), id);
  }
  byte_ids_.fill(-1);
  ascii_ids_.fill(-1);
  for (int c = 0; c < 128; ++c) {
    if (auto id = lookup(std::string(1, static_cast<char>(c))); id && !options_.byte_level) ascii_ids_[c] = *id;
  }
  for (int b = 0; b < 256; ++b) {
    if (options_.byte_level) {
      const std::string key(1, static_cast<char>(b));
      if (auto id = lookup(key)) byte_ids_[b] = *id;
    } else if (options_.byte_fallback) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      if (auto id = lookup(name)) byte_ids_[b] = *id;
    }
  }
  merges_ = MergeTable(merges.size());
  for (std::uint32_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto left = lookup(model_key(a));
    const auto right = lookup(model_key(b));
    const auto merged = lookup(model_key(a + b));
    if (!left || !right || !merged) continue;  // a merge that cannot produce a vocab token
    merges_.insert(*left, *right, Merge{rank, *merged});
    if (!options_.byte_level) note_word_crossing(a + b);
  }
  if (no_cut_after_.size() > 16) split_words_ = false;  // not worth checking
}

BpeModel::~BpeModel() = default;

// SentencePiece models often come without a pre-tokenizer, so a whole line is one BPE word. A merge
// can only join across a U+2581 that follows character c if some merge builds a token containing
// "c" + U+2581 (Gemma has one: ">▁</"). Cutting the word before every other U+2581 therefore gives
// the same ids, and lets the per-word cache work.
void BpeModel::note_word_crossing(std::string_view merged) {
  for (std::size_t p = merged.find(kMetaspace, 1); p != std::string_view::npos; p = merged.find(kMetaspace, p + 1)) {
    const char32_t before = char_before(merged, p);
    if (before == 0x2581) continue;
    if (std::find(no_cut_after_.begin(), no_cut_after_.end(), before) == no_cut_after_.end()) {
      no_cut_after_.push_back(before);
    }
  }
}

std::size_t BpeModel::next_word_start(std::string_view word, std::size_t from) const {
  for (std::size_t p = word.find(kMetaspace, from); p != std::string_view::npos; p = word.find(kMetaspace, p + 1)) {
    if (p == 0) continue;
    const char32_t before = char_before(word, p);
    if (before == 0x2581) continue;
    if (std::find(no_cut_after_.begin(), no_cut_after_.end(), before) == no_cut_after_.end()) return p;
  }
  return std::string_view::npos;
}

std::string BpeModel::model_key(std::string_view vocab_string) const {
  if (!options_.byte_level) return std::string(vocab_string);
  std::string key;
  key.reserve(vocab_string.size());
  for (std::size_t i = 0, len = 0; i < vocab_string.size(); i += len) {
    const auto byte = unicode_to_byte(utf8_decode(vocab_string, i, len));
    if (!byte) return {};
    key.push_back(static_cast<char>(*byte));
  }
  return key;
}

std::optional<TokenId> BpeModel::lookup(std::string_view key) const {
  const auto it = vocab_.find(key);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

namespace {

// byte_ids: per byte when byte level, else per ASCII character (-1: look the character up).
void initial_symbols(std::string_view word, bool byte_level, const std::array<TokenId, 256>& byte_ids,
                     const std::array<TokenId, 128>& ascii_ids, const StringMap& vocab,
                     std::vector<Symbol>& symbols) {
  symbols.clear();
  symbols.reserve(word.size());
  for (std::uint32_t i = 0; i < word.size();) {
    std::size_t len = 1;
    TokenId id;
    if (byte_level) {
      id = byte_ids[static_cast<unsigned char>(word[i])];
    } else if (static_cast<unsigned char>(word[i]) < 0x80) {
      id = ascii_ids[static_cast<unsigned char>(word[i])];
    } else {
      utf8_decode(word, i, len);
      const auto it = vocab.find(word.substr(i, len));
      id = it == vocab.end() ? -1 : it->second;
    }
    const auto n = static_cast<std::int32_t>(symbols.size());
    symbols.push_back({id, i, static_cast<std::uint32_t>(len), n - 1, n + 1});
    i += static_cast<std::uint32_t>(len);
  }
  if (!symbols.empty()) symbols.back().next = -1;
}

}  // namespace

void BpeModel::merge_small(std::vector<Symbol>& symbols) const {
  std::vector<std::uint32_t> ranks(symbols.size() - 1);
  std::vector<TokenId> merged(symbols.size() - 1);
  auto rank_at = [&](std::size_t i) {
    const Merge* m = merge_of(symbols[i].id, symbols[i + 1].id);
    ranks[i] = m ? m->rank : kNoRank;
    merged[i] = m ? m->merged : -1;
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) rank_at(i);
  while (!ranks.empty()) {
    const auto best = std::min_element(ranks.begin(), ranks.end());
    if (*best == kNoRank) break;
    const auto i = static_cast<std::size_t>(best - ranks.begin());
    symbols[i].id = merged[i];
    symbols[i].len += symbols[i + 1].len;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(i));
    merged.erase(merged.begin() + static_cast<std::ptrdiff_t>(i));
    if (i > 0) rank_at(i - 1);
    if (i < ranks.size()) rank_at(i);
  }
}

void BpeModel::merge_large(std::vector<Symbol>& symbols) const {
  struct Candidate {
    std::uint32_t rank;
    std::int32_t pos;
    TokenId left;
    TokenId right;
    TokenId merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](std::int32_t pos) {
    if (pos < 0 || symbols[pos].next < 0) return;
    const Symbol& a = symbols[pos];
    const Symbol& b = symbols[a.next];
    if (const Merge* m = merge_of(a.id, b.id)) heap.push({m->rank, pos, a.id, b.id, m->merged});
  };
  for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& a = symbols[c.pos];
    // Stale when either side was merged away or changed since the candidate was queued.
    if (a.len == 0 || a.id != c.left || a.next < 0 || symbols[a.next].id != c.right) continue;
    Symbol& b = symbols[a.next];
    a.id = c.merged;
    a.len += b.len;
    a.next = b.next;
    if (b.next >= 0) symbols[b.next].prev = c.pos;
    b.len = 0;
    b.id = -2;
    consider(a.prev);
    consider(c.pos);
  }
  std::size_t out = 0;
  for (std::int32_t i = 0; i >= 0; i = symbols[i].next) symbols[out++] = symbols[i];
  symbols.resize(out);
}

void BpeModel::emit(std::string_view word, const std::vector<Symbol>& symbols,
                    std::vector<TokenId>& out) const {
  bool last_unk = false;
  for (const Symbol& s : symbols) {
    if (s.id >= 0) {
      out.push_back(s.id);
      last_unk = false;
      continue;
    }
    const std::string_view text = word.substr(s.begin, s.len);
    bool all_bytes = options_.byte_fallback;
    for (const char c : text) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
    if (all_bytes) {
      for (const char c : text) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      last_unk = false;
    } else if (options_.unk_id && !(options_.fuse_unk && last_unk)) {
      out.push_back(*options_.unk_id);
      last_unk = true;
    }
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (split_words_ && !options_.ignore_merges && word.size() > kMetaspace.size()) {
    std::size_t begin = 0;
    for (std::size_t p; (p = next_word_start(word, begin + 1)) != std::string_view::npos; begin = p) {
      encode_piece(word.substr(begin, p - begin), out);
    }
    return encode_piece(word.substr(begin), out);
  }
  encode_piece(word, out);
}

void BpeModel::encode_piece(std::string_view word, std::vector<TokenId>& out) const {
  if (options_.ignore_merges) {
    if (const auto id = lookup(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWord;
  Cache::Shard* shard = cacheable ? &cache_->shard_for(word) : nullptr;
  if (shard) {
    std::lock_guard lock(shard->mutex);
    if (const auto it = shard->map.find(word); it != shard->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<Symbol> symbols;
  initial_symbols(word, options_.byte_level, byte_ids_, ascii_ids_, vocab_, symbols);
  if (symbols.size() > kHeapThreshold) {
    merge_large(symbols);
  } else if (symbols.size() > 1) {
    merge_small(symbols);
  }
  const std::size_t first = out.size();
  emit(word, symbols, out);
  if (shard) {
    std::vector<TokenId> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    std::lock_guard lock(shard->mutex);
    if (shard->map.size() >= kCacheEntriesPerShard) shard->map.clear();
    shard->map.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace kvfleet::tok
