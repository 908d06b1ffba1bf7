// Compiled grammars kept by (kind, hash of the grammar text and options, vocabulary fingerprint), least
// recently used first out when the entry or byte bound is passed. Bytes count each grammar's automaton and
// the position tables it has filled so far. Thread-safe; a compile runs outside the lock.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "engine/grammar/grammar.h"

namespace kvfleet::grammar {

class GrammarCache {
 public:
  struct Limits {
    std::size_t max_entries = 256;
    std::size_t max_bytes = std::size_t{512} << 20;
  };
  GrammarCache() : GrammarCache(Limits{}) {}
  explicit GrammarCache(Limits limits) : limits_(limits) {}

  // Throws GrammarError as compile() does (errors are not cached).
  std::shared_ptr<const TokenGrammar> get_or_compile(const GrammarSpec& spec, std::shared_ptr<const Vocabulary> vocab,
                                                     const GrammarOptions& options = {});
  std::size_t entries() const;
  std::size_t bytes() const;
  std::uint64_t hits() const;

 private:
  struct Entry {
    std::uint64_t key;
    std::shared_ptr<const TokenGrammar> grammar;
  };
  void evict_locked();

  Limits limits_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // front: most recently used
  std::unordered_map<std::uint64_t, std::list<Entry>::iterator> index_;
  std::uint64_t hits_ = 0;
};

}  // namespace kvfleet::grammar
