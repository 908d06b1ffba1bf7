#include "engine/grammar/token_grammar.h"

#include <algorithm>
#include <bitset>
#include <limits>
#include <map>

namespace kvfleet::grammar {
namespace {

inline void set_bit(std::span<std::uint32_t> mask, TokenId id) {
  mask[static_cast<std::size_t>(id) / 32] |= 1u << (static_cast<std::size_t>(id) % 32);
}

class Matcher final : public TokenMatcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar)
      : grammar_(std::move(grammar)), engine_(grammar_->automaton()) {
    set_ = engine_.root_set();
  }

  void fill_next_token_mask(std::span<std::uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    const Vocabulary& vocab = grammar_->vocab();
    if (stopped_ || engine_.can_end(set_)) {
      for (const TokenId id : vocab.stop_ids()) set_bit(mask, id);
    }
    if (stopped_) return;
    const auto members = engine_.members(set_);
    const std::vector<std::int32_t> stacks(members.begin(), members.end());
    for (const std::int32_t stack : stacks) {
      if (stack == ParseEngine::kEmptyStack) continue;
      const PositionMask& pm = grammar_->position_mask(engine_.top_state(stack));
      const std::size_t words = std::min(mask.size(), pm.accepted.size());
      for (std::size_t w = 0; w < words; ++w) mask[w] |= pm.accepted[w];
      check_uncertain(engine_.singleton(stack), pm.uncertain, mask);
    }
  }

  bool accept_token(TokenId id) override {
    if (stopped_ || id < 0 || static_cast<std::size_t>(id) >= grammar_->vocab_size()) return false;
    const Vocabulary& vocab = grammar_->vocab();
    if (vocab.is_stop(id)) {
      if (!engine_.can_end(set_)) return false;
      history_.push_back(set_);
      stopped_ = true;
      return true;
    }
    const std::string& bytes = vocab.bytes(id);
    if (bytes.empty()) return false;
    const std::int32_t next = engine_.feed(set_, bytes);
    if (next == ParseEngine::kDead) return false;
    history_.push_back(set_);
    set_ = next;
    return true;
  }

  void rollback(std::size_t n) override {
    n = std::min(n, history_.size());
    if (n == 0) return;
    stopped_ = false;  // a stop token is always the last accepted one
    set_ = history_[history_.size() - n];
    history_.resize(history_.size() - n);
  }

  bool is_terminated() const override { return stopped_ || !engine_.can_continue(set_); }

 private:
  // Tokens in trie order share prefixes: the parse set after each prefix length is reused.
  void check_uncertain(std::int32_t start, const std::vector<TokenId>& tokens, std::span<std::uint32_t> mask) {
    const Vocabulary& vocab = grammar_->vocab();
    const std::string* prev = nullptr;
    std::size_t valid = 0;  // depth_sets_[0..valid] hold the sets after prev's first bytes
    depth_sets_.assign(1, start);
    for (const TokenId id : tokens) {
      if (bitmask_allows(mask, id)) continue;
      const std::string& b = vocab.bytes(id);
      std::size_t d = 0;
      if (prev) {
        const std::size_t limit = std::min({valid, prev->size(), b.size()});
        while (d < limit && (*prev)[d] == b[d]) ++d;
      }
      if (depth_sets_.size() < b.size() + 1) depth_sets_.resize(b.size() + 1);
      std::int32_t set = depth_sets_[d];
      for (std::size_t i = d; i < b.size() && set != ParseEngine::kDead; ++i) {
        set = engine_.step(set, static_cast<std::uint8_t>(b[i]));
        depth_sets_[i + 1] = set;
        d = i + 1;
      }
      valid = d;
      prev = &b;
      if (set != ParseEngine::kDead) set_bit(mask, id);
    }
  }

  std::shared_ptr<const CompiledGrammar> grammar_;
  ParseEngine engine_;
  std::int32_t set_;
  bool stopped_ = false;
  std::vector<std::int32_t> history_;
  std::vector<std::int32_t> depth_sets_;
};

}  // namespace

CompiledGrammar::CompiledGrammar(Automaton automaton, std::shared_ptr<const Vocabulary> vocab)
    : automaton_(std::move(automaton)), vocab_(std::move(vocab)), walker_(automaton_), masks_(automaton_.states.size()) {}

CompiledGrammar::~CompiledGrammar() {
  for (auto& m : masks_) delete m.load();
}

std::unique_ptr<TokenMatcher> CompiledGrammar::make_matcher() const {
  return std::make_unique<Matcher>(shared_from_this());
}

const PositionMask& CompiledGrammar::position_mask(std::int32_t state) const {
  if (const PositionMask* m = masks_[state].load(std::memory_order_acquire)) return *m;
  std::lock_guard lock(mutex_);
  if (const PositionMask* m = masks_[state].load(std::memory_order_relaxed)) return *m;
  auto* m = new PositionMask(compute_position_mask(state));
  mask_bytes_ += m->accepted.size() * 4 + m->uncertain.size() * 4;
  masks_[state].store(m, std::memory_order_release);
  return *m;
}

// One preorder walk of the trie from the stack [state]; a refused prefix skips its subtree. The empty
// stack in a set means the position's rule has ended: a token that goes on past that point is uncertain.
PositionMask CompiledGrammar::compute_position_mask(std::int32_t state) const {
  PositionMask pm;
  pm.accepted.assign(bitmask_words(vocab_->size()), 0u);
  const Vocabulary::Node* nodes = vocab_->nodes().data();
  const std::size_t node_count = vocab_->nodes().size();
  const TokenId* node_tokens = vocab_->tokens_at_nodes().data();
  std::uint32_t* accepted = pm.accepted.data();
  // at[d]: the set after the first d bytes of the current path, and whether the position's rule may
  // have ended within them (bit 31 of the packed word; set ids stay below 2^31).
  constexpr std::uint32_t kEnded = 1u << 31;
  std::vector<std::uint32_t> at(vocab_->max_token_bytes() + 1);
  at[0] = static_cast<std::uint32_t>(walker_.position_set(state));
  // Bytes on which a set steps back to itself (a JSON string's body), per set met at a large subtree.
  std::vector<std::pair<std::int32_t, std::bitset<256>>> loops;
  auto loop_bytes = [&](std::int32_t set) -> const std::bitset<256>& {
    for (const auto& [id, bytes] : loops) {
      if (id == set) return bytes;
    }
    std::bitset<256> bytes;
    for (unsigned b = 0; b < 256; ++b) {
      if (walker_.step(set, static_cast<std::uint8_t>(b)) == set) bytes.set(b);
    }
    return loops.emplace_back(set, bytes).second;
  };
  const auto& subtrees = vocab_->subtrees();
  std::vector<std::pair<std::uint64_t, std::int32_t>> horizons;  // this walk's plain_horizon answers
  std::uint64_t last_key = ~0ull;
  std::int32_t last_horizon = 0;
  auto horizon = [&](std::uint8_t utf8, std::int32_t set) {
    const std::uint64_t key = (static_cast<std::uint64_t>(set) << 4) | utf8;
    if (key == last_key) return last_horizon;
    last_key = key;
    for (const auto& [k, h] : horizons) {
      if (k == key) return last_horizon = h;
    }
    return last_horizon = horizons.emplace_back(key, plain_horizon(utf8, set)).second;
  };
  auto accept_subtree = [&](const Vocabulary::Node& node) {
    const std::int32_t last = nodes[node.subtree_end - 1].tokens_end;
    for (std::int32_t t = node.tokens_begin; t < last; ++t) {
      const auto id = static_cast<std::uint32_t>(node_tokens[t]);
      accepted[id / 32] |= 1u << (id % 32);
    }
  };
  for (std::size_t n = 0; n < node_count;) {
    const Vocabulary::Node& node = nodes[n];
    const std::uint32_t parent = at[node.depth - 1];
    if (node.subtree >= 0) {
      const std::int32_t from = static_cast<std::int32_t>(parent & ~kEnded);
      const Vocabulary::Subtree& sub = subtrees[static_cast<std::size_t>(node.subtree)];
      if ((sub.bytes & ~loop_bytes(from)).none()) {
        // Every token below stays in `from`: accepted without a walk.
        accept_subtree(node);
        n = static_cast<std::size_t>(node.subtree_end);
        continue;
      }
    }
    if (node.plain && node.subtree_end > static_cast<std::int32_t>(n) + 1 &&
        horizon(node.utf8_before, static_cast<std::int32_t>(parent & ~kEnded)) >= node.height) {
      // Plain text no longer than any string `from` takes: every token below is accepted without a walk.
      accept_subtree(node);
      n = static_cast<std::size_t>(node.subtree_end);
      continue;
    }
    const std::int32_t set = walker_.step(static_cast<std::int32_t>(parent & ~kEnded), node.byte);
    if (set == ParseEngine::kDead) {
      if (parent & kEnded) {
        pm.uncertain.insert(pm.uncertain.end(), node_tokens + node.tokens_begin,
                            node_tokens + nodes[node.subtree_end - 1].tokens_end);
      }
      n = static_cast<std::size_t>(node.subtree_end);
      continue;
    }
    for (std::int32_t t = node.tokens_begin; t < node.tokens_end; ++t) {
      const auto id = static_cast<std::uint32_t>(node_tokens[t]);
      accepted[id / 32] |= 1u << (id % 32);
    }
    at[node.depth] = static_cast<std::uint32_t>(set) | (parent & kEnded) | (walker_.can_end(set) ? kEnded : 0u);
    ++n;
  }
  return pm;
}

// How many plain-text bytes (valid UTF-8 continuing from decoder state `utf8`) any string of them may
// have, from `set`, before one can die: the shortest distance to a dying step in the graph of (decoder
// state, parse set) pairs that plain bytes reach, by a backward breadth-first search; cached for every
// pair of the graph. INT32_MAX when none dies; 0 when the graph is larger than a bound.
std::int32_t CompiledGrammar::plain_horizon(std::uint8_t utf8, std::int32_t set) const {
  constexpr std::int32_t kNone = std::numeric_limits<std::int32_t>::max();
  constexpr std::size_t kMaxPairs = 2048;
  auto key = [](std::uint8_t u, std::int32_t s) { return (static_cast<std::uint64_t>(s) << 4) | u; };
  if (const auto it = horizons_.find(key(utf8, set)); it != horizons_.end()) return it->second;
  std::vector<std::pair<std::uint8_t, std::int32_t>> pairs{{utf8, set}};
  std::unordered_map<std::uint64_t, std::int32_t> index{{key(utf8, set), 0}};
  std::vector<std::vector<std::int32_t>> preds(1);
  std::vector<std::int32_t> dist(1, kNone);
  std::vector<std::int32_t> queue;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const auto [u, s] = pairs[i];
    if (const auto it = horizons_.find(key(u, s)); it != horizons_.end() && i > 0) {
      if (it->second != kNone) {
        dist[i] = it->second;
        queue.push_back(static_cast<std::int32_t>(i));
      }
      continue;  // known: its successors need not be explored
    }
    for (unsigned b = 0; b < 256 && dist[i] != 0; ++b) {
      const auto byte = static_cast<std::uint8_t>(b);
      if (!plain_byte(byte)) continue;
      const std::uint8_t nu = utf8_next(u, byte);
      if (nu == kUtf8Invalid) continue;
      const std::int32_t t = walker_.step(s, byte);
      if (t == ParseEngine::kDead) {
        dist[i] = 0;
        queue.push_back(static_cast<std::int32_t>(i));
        break;
      }
      const auto [it, inserted] = index.try_emplace(key(nu, t), static_cast<std::int32_t>(pairs.size()));
      if (inserted) {
        if (pairs.size() >= kMaxPairs) {
          horizons_[key(utf8, set)] = 0;
          return 0;
        }
        pairs.emplace_back(nu, t);
        preds.emplace_back();
        dist.push_back(kNone);
      }
      preds[static_cast<std::size_t>(it->second)].push_back(static_cast<std::int32_t>(i));
    }
  }
  // Backward from the pairs that can die (or whose distance is known), shortest distances first.
  std::vector<char> done(pairs.size(), 0);
  // A Dijkstra with unit weights: sources have different start distances, so keep a sorted frontier.
  std::multimap<std::int32_t, std::int32_t> frontier;
  for (const std::int32_t i : queue) frontier.emplace(dist[i], i);
  while (!frontier.empty()) {
    const auto [d, i] = *frontier.begin();
    frontier.erase(frontier.begin());
    if (done[i] || d != dist[i]) continue;
    done[i] = 1;
    for (const std::int32_t p : preds[i]) {
      if (!done[p] && d + 1 < dist[p]) {
        dist[p] = d + 1;
        frontier.emplace(d + 1, p);
      }
    }
  }
  for (std::size_t i = 0; i < pairs.size(); ++i) horizons_[key(pairs[i].first, pairs[i].second)] = dist[i];
  return dist[0];
}

std::size_t CompiledGrammar::memory_bytes() const {
  std::size_t states = 0;
  for (const auto& st : automaton_.states) states += sizeof st + st.byte_edges.size() * 40 + st.call_edges.size() * 8;
  std::lock_guard lock(mutex_);
  return states + mask_bytes_.load() + walker_.memory_bytes() + horizons_.size() * 32;
}

}  // namespace kvfleet::grammar
