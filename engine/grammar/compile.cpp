// compile(): front end -> IR -> automaton -> CompiledGrammar; the byte-level matcher; the cache.
#include <xxhash.h>

#include "engine/grammar/front_ends.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/grammar/token_grammar.h"

namespace kvfleet::grammar {

GrammarError::GrammarError(const std::string& message, std::string schema_path, std::string keyword)
    : std::runtime_error(message), schema_path_(std::move(schema_path)), keyword_(std::move(keyword)) {}

namespace {

Automaton build(const GrammarSpec& spec, const GrammarOptions& options) {
  const auto deadline = std::chrono::steady_clock::now() + options.compile_budget;
  Grammar g = [&] {
    switch (spec.kind) {
      case GrammarKind::gbnf: return parse_gbnf(spec.text);
      case GrammarKind::regex: return regex_grammar(spec.text);
      case GrammarKind::choice: return choice_grammar(spec.choices);
      case GrammarKind::json_schema: return json_schema_grammar(spec.text, options);
      case GrammarKind::json_object: return json_object_grammar(options);
    }
    throw GrammarError("unknown grammar kind");
  }();
  if (std::chrono::steady_clock::now() > deadline) throw GrammarError("the grammar takes too long to compile");
  inline_small_rules(g, kInlineNodes);
  Automaton a = build_automaton(g, AutomatonLimits{options.max_states, deadline});
  merge_equivalent_states(a);
  return a;
}

class Bytes final : public ByteMatcher {
 public:
  explicit Bytes(Automaton a) : a_(std::move(a)), engine_(a_), set_(engine_.root_set()) {}
  bool feed(std::string_view bytes) override {
    const std::int32_t next = engine_.feed(set_, bytes);
    if (next == ParseEngine::kDead) return false;
    set_ = next;
    return true;
  }
  bool can_end() const override { return engine_.can_end(set_); }

 private:
  Automaton a_;
  ParseEngine engine_;
  std::int32_t set_;
};

std::uint64_t cache_key(const GrammarSpec& spec, const Vocabulary& vocab, const GrammarOptions& o) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  const std::uint64_t head[] = {static_cast<std::uint64_t>(spec.kind), vocab.fingerprint(), o.whitespace_bound,
                                o.strict_objects ? 1u : 0u, o.max_states};
  XXH3_64bits_update(state, head, sizeof head);
  XXH3_64bits_update(state, spec.text.data(), spec.text.size());
  for (const std::string& c : spec.choices) {
    const std::uint64_t len = c.size();
    XXH3_64bits_update(state, &len, sizeof len);
    XXH3_64bits_update(state, c.data(), c.size());
  }
  const std::uint64_t key = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return key;
}

}  // namespace

std::shared_ptr<const TokenGrammar> compile(const GrammarSpec& spec, std::shared_ptr<const Vocabulary> vocab,
                                            const GrammarOptions& options) {
  return std::make_shared<const CompiledGrammar>(build(spec, options), std::move(vocab));
}

std::unique_ptr<ByteMatcher> compile_bytes(const GrammarSpec& spec, const GrammarOptions& options) {
  return std::make_unique<Bytes>(build(spec, options));
}

std::shared_ptr<const TokenGrammar> GrammarCache::get_or_compile(const GrammarSpec& spec,
                                                                 std::shared_ptr<const Vocabulary> vocab,
                                                                 const GrammarOptions& options) {
  const std::uint64_t key = cache_key(spec, *vocab, options);
  {
    std::lock_guard lock(mutex_);
    if (const auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->grammar;
    }
  }
  auto grammar = compile(spec, std::move(vocab), options);
  std::lock_guard lock(mutex_);
  if (const auto it = index_.find(key); it != index_.end()) return it->second->grammar;
  lru_.push_front(Entry{key, grammar});
  index_[key] = lru_.begin();
  evict_locked();
  return grammar;
}

void GrammarCache::evict_locked() {
  auto total = [&] {
    std::size_t sum = 0;
    for (const Entry& e : lru_) sum += static_cast<const CompiledGrammar&>(*e.grammar).memory_bytes();
    return sum;
  };
  while (lru_.size() > 1 && (lru_.size() > limits_.max_entries || total() > limits_.max_bytes)) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

std::size_t GrammarCache::entries() const {
  std::lock_guard lock(mutex_);
  return lru_.size();
}

std::size_t GrammarCache::bytes() const {
  std::lock_guard lock(mutex_);
  std::size_t sum = 0;
  for (const Entry& e : lru_) sum += static_cast<const CompiledGrammar&>(*e.grammar).memory_bytes();
  return sum;
}

std::uint64_t GrammarCache::hits() const {
  std::lock_guard lock(mutex_);
  return hits_;
}

}  // namespace kvfleet::grammar
