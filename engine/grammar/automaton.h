// A grammar compiled to one byte-level automaton per rule (xgrammar's layout): states with edges on
// byte sets and edges that call another rule (a pushdown automaton's push; the callee's accepting
// states pop). Epsilon edges are removed at build time; every state left can reach an accepting state
// (so any stack the parser builds can still complete), and left recursion is refused.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/grammar/ir.h"

namespace kvfleet::grammar {

struct Automaton {
  struct State {
    std::int32_t rule = 0;
    bool accept = false;
    bool pure_end = false;  // accepting with no edges: a call whose return lands here is a tail call
    std::vector<std::pair<ByteSet, std::int32_t>> byte_edges;       // (bytes, target)
    std::vector<std::pair<std::int32_t, std::int32_t>> call_edges;  // (rule, return target)
  };
  std::vector<State> states;
  std::vector<std::int32_t> rule_start;  // -1 for rules never reached from the root
  std::vector<std::string> rule_names;
  std::int32_t root = 0;
};

struct AutomatonLimits {
  std::size_t max_states = 200000;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

// Throws GrammarError: undefined rule, too many states, past the deadline, left recursion, a root
// that matches no string.
Automaton build_automaton(const Grammar& grammar, const AutomatonLimits& limits);

// Merges states that behave alike (the same rule and acceptance, byte edges on the same bytes to merged
// states, the same calls returning to merged states). The language is unchanged; fewer states mean
// fewer positions to compute masks for, and a loop like a JSON string's body becomes one state that
// steps back to itself on every character.
void merge_equivalent_states(Automaton& automaton);

}  // namespace kvfleet::grammar
