// The parser behind a matcher: a set of pushdown stacks, advanced a byte at a time.
//
// A stack is a node (parent stack, automaton state), interned so equal stacks share one id; node 0 is
// the empty stack (the grammar has been completed). The top of a stack in a parse set always waits for a
// byte (its state has byte edges): calls are expanded and accepting states popped eagerly (the closure),
// and a call that returns to a pure end state is a tail call (the caller's frame is dropped), so right
// recursion and loops keep stacks short. A parse set is a sorted list of stack ids, interned too; set 0
// is dead (no stack survived). step(set, byte) is memoised per (set, byte): a DFA built lazily over the
// pushdown automaton, so repeated walks (token masks, trie walks) cost a table lookup per byte.
//
// Not thread-safe: one engine per user (a matcher; the compiled grammar's own, under its lock).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/grammar/automaton.h"

namespace kvfleet::grammar {

class ParseEngine {
 public:
  static constexpr std::int32_t kEmptyStack = 0;
  static constexpr std::int32_t kDead = 0;

  explicit ParseEngine(const Automaton& automaton);

  std::int32_t root_set();                      // the sets before any byte
  std::int32_t position_set(std::int32_t state);  // {the stack [state]}: a mask walk from one position
  std::int32_t singleton(std::int32_t stack);   // {stack}; `stack` waits for a byte
  std::int32_t step(std::int32_t set, std::uint8_t byte) {
    const std::size_t at = static_cast<std::size_t>(set) * 256 + byte;
    if (trans_[at] >= 0) return trans_[at];
    const std::int32_t next = compute_step(set, byte);  // may grow trans_
    trans_[at] = next;
    return next;
  }
  std::int32_t feed(std::int32_t set, std::string_view bytes) {
    for (const char c : bytes) {
      if (set == kDead) break;
      set = step(set, static_cast<std::uint8_t>(c));
    }
    return set;
  }

  std::span<const std::int32_t> members(std::int32_t set) const {
    const auto& [offset, size] = sets_[set];
    return {pool_.data() + offset, size};
  }
  bool can_end(std::int32_t set) const { return ends_[static_cast<std::size_t>(set)] != 0; }
  bool can_continue(std::int32_t set) const {
    return sets_[set].second > 0 && pool_[sets_[set].first + sets_[set].second - 1] != kEmptyStack;
  }
  std::int32_t top_state(std::int32_t stack) const { return nodes_[stack].state; }
  std::size_t memory_bytes() const;

 private:
  struct Node {
    std::int32_t parent;
    std::int32_t state;
  };
  std::int32_t intern_node(std::int32_t parent, std::int32_t state);
  std::int32_t intern_set(std::vector<std::int32_t>& members);  // sorts and dedupes
  void closure(std::int32_t stack, std::vector<std::int32_t>& out);
  std::int32_t compute_step(std::int32_t set, std::uint8_t byte);

  const Automaton& a_;
  std::vector<Node> nodes_;
  std::unordered_map<std::uint64_t, std::int32_t> node_ids_;
  std::vector<std::int32_t> closure_offset_;  // per node: into closure_pool_, -1 until computed
  std::vector<std::int32_t> closure_size_;
  std::vector<std::int32_t> closure_pool_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> sets_;  // (offset, size) into pool_
  std::vector<std::int32_t> pool_;
  std::vector<char> ends_;  // per set: it holds the empty stack
  std::unordered_map<std::u32string, std::int32_t> set_ids_;
  std::vector<std::int32_t> trans_;
  std::int32_t root_set_ = -1;
  std::vector<std::int32_t> scratch_, todo_, visited_;
  std::vector<std::uint32_t> visit_mark_;
  std::uint32_t visit_epoch_ = 0;
};

}  // namespace kvfleet::grammar
