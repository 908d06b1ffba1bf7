#include "engine/grammar/automaton.h"

#include <algorithm>

#include "engine/grammar/grammar.h"

namespace kvfleet::grammar {
namespace {

// Thompson construction with epsilon edges, one rule at a time.
class Thompson {
 public:
  struct Node {
    std::vector<int> eps;
    std::vector<std::pair<ByteSet, int>> byte_edges;
    std::vector<std::pair<int, int>> call_edges;
  };

  Thompson(const AutomatonLimits& limits, std::size_t already) : limits_(limits), already_(already) {}

  int add() {
    if (already_ + nodes.size() >= limits_.max_states) {
      throw GrammarError("the grammar is too large (more than " + std::to_string(limits_.max_states) +
                         " automaton states)");
    }
    if ((nodes.size() & 1023) == 0 && std::chrono::steady_clock::now() > limits_.deadline) {
      throw GrammarError("the grammar takes too long to compile");
    }
    nodes.emplace_back();
    return static_cast<int>(nodes.size()) - 1;
  }

  // Adds `e` starting at `from`; returns its end node.
  int build(const Expr& e, int from, std::vector<int>& called) {
    switch (e.kind) {
      case Expr::Kind::bytes: {
        const int to = add();
        if (e.bytes.any()) nodes[from].byte_edges.emplace_back(e.bytes, to);
        return to;
      }
      case Expr::Kind::ref: {
        const int to = add();
        nodes[from].call_edges.emplace_back(e.rule, to);
        called.push_back(e.rule);
        return to;
      }
      case Expr::Kind::seq: {
        int cur = from;
        for (const auto& item : e.items) cur = build(*item, cur, called);
        return cur;
      }
      case Expr::Kind::alt: {
        const int end = add();
        for (const auto& item : e.items) {
          const int start = add();
          nodes[from].eps.push_back(start);
          const int last = build(*item, start, called);
          nodes[last].eps.push_back(end);
        }
        return end;
      }
      case Expr::Kind::repeat: {
        int cur = from;
        for (std::size_t i = 0; i < e.min; ++i) cur = build(*e.items[0], cur, called);
        if (e.max == kUnbounded) {
          const int loop = add();
          nodes[cur].eps.push_back(loop);
          const int last = build(*e.items[0], loop, called);
          nodes[last].eps.push_back(loop);
          return loop;
        }
        const int end = add();
        for (std::size_t i = e.min; i < e.max; ++i) {
          nodes[cur].eps.push_back(end);
          cur = build(*e.items[0], cur, called);
        }
        nodes[cur].eps.push_back(end);
        return end;
      }
    }
    return from;
  }

  std::vector<Node> nodes;

 private:
  const AutomatonLimits& limits_;
  std::size_t already_;
};

// Removes epsilon edges of one rule's Thompson graph and appends its reachable states to `a`.
std::int32_t append_rule(Automaton& a, int rule, const Thompson& t, int start, int end) {
  const int n = static_cast<int>(t.nodes.size());
  std::vector<std::vector<int>> closure(n);
  std::vector<int> mark(n, -1);
  for (int s = 0; s < n; ++s) {
    std::vector<int> todo{s};
    mark[s] = s;
    while (!todo.empty()) {
      const int x = todo.back();
      todo.pop_back();
      closure[s].push_back(x);
      for (const int y : t.nodes[x].eps) {
        if (mark[y] != s) {
          mark[y] = s;
          todo.push_back(y);
        }
      }
    }
  }
  std::vector<std::int32_t> id(n, -1);
  std::vector<int> order{start};
  const auto base = static_cast<std::int32_t>(a.states.size());
  id[start] = base;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int s = order[i];
    Automaton::State st;
    st.rule = rule;
    for (const int x : closure[s]) {
      if (x == end) st.accept = true;
      for (const auto& [set, to] : t.nodes[x].byte_edges) {
        if (id[to] < 0) {
          id[to] = base + static_cast<std::int32_t>(order.size());
          order.push_back(to);
        }
        const auto target = id[to];  // (a structured binding cannot be captured before C++20 in clang)
        auto same = std::find_if(st.byte_edges.begin(), st.byte_edges.end(), [&](auto& e) { return e.second == target; });
        if (same != st.byte_edges.end()) same->first |= set;
        else st.byte_edges.emplace_back(set, id[to]);
      }
      for (const auto& [callee, to] : t.nodes[x].call_edges) {
        if (id[to] < 0) {
          id[to] = base + static_cast<std::int32_t>(order.size());
          order.push_back(to);
        }
        const std::pair<std::int32_t, std::int32_t> edge{callee, id[to]};
        if (std::find(st.call_edges.begin(), st.call_edges.end(), edge) == st.call_edges.end()) {
          st.call_edges.push_back(edge);
        }
      }
    }
    a.states.push_back(std::move(st));
  }
  return base;
}

// Keeps only states that can reach acceptance; fails when the root cannot.
void prune_unproductive(Automaton& a) {
  std::vector<char> prod(a.states.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t s = 0; s < a.states.size(); ++s) {
      if (prod[s]) continue;
      const auto& st = a.states[s];
      bool p = st.accept;
      for (const auto& e : st.byte_edges) p = p || prod[e.second];
      for (const auto& [callee, to] : st.call_edges) p = p || (prod[a.rule_start[callee]] && prod[to]);
      if (p) prod[s] = changed = true;
    }
  }
  if (!prod[a.rule_start[a.root]]) throw GrammarError("the grammar matches no string");
  for (auto& st : a.states) {
    std::erase_if(st.byte_edges, [&](const auto& e) { return !prod[e.second]; });
    std::erase_if(st.call_edges, [&](const auto& e) { return !prod[a.rule_start[e.first]] || !prod[e.second]; });
  }
}

// A rule that can call itself before reading a byte would make the parser's stack grow forever.
void refuse_left_recursion(const Automaton& a) {
  std::vector<char> nullable(a.states.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t s = 0; s < a.states.size(); ++s) {
      if (nullable[s]) continue;
      bool n = a.states[s].accept;
      for (const auto& [callee, to] : a.states[s].call_edges) n = n || (nullable[a.rule_start[callee]] && nullable[to]);
      if (n) nullable[s] = changed = true;
    }
  }
  std::vector<int> seen(a.states.size(), -1);
  for (std::size_t r = 0; r < a.rule_start.size(); ++r) {
    const std::int32_t start = a.rule_start[r];
    if (start < 0) continue;
    std::vector<std::int32_t> todo{start};
    seen[start] = static_cast<int>(r);
    while (!todo.empty()) {
      const std::int32_t s = todo.back();
      todo.pop_back();
      for (const auto& [callee, to] : a.states[s].call_edges) {
        const std::int32_t callee_start = a.rule_start[callee];
        if (callee_start == start) {
          throw GrammarError("rule '" + a.rule_names[r] + "' is left-recursive (it can reach itself before any text)");
        }
        for (const std::int32_t next : {callee_start, nullable[callee_start] ? to : -1}) {
          if (next >= 0 && seen[next] != static_cast<int>(r)) {
            seen[next] = static_cast<int>(r);
            todo.push_back(next);
          }
        }
      }
    }
  }
}

}  // namespace

Automaton build_automaton(const Grammar& grammar, const AutomatonLimits& limits) {
  Automaton a;
  a.rule_names = grammar.names;
  a.root = grammar.root;
  a.rule_start.assign(grammar.rules.size(), -1);
  std::vector<int> todo{grammar.root};
  std::vector<char> queued(grammar.rules.size(), 0);
  queued[grammar.root] = 1;
  while (!todo.empty()) {
    const int rule = todo.back();
    todo.pop_back();
    if (!grammar.rules[rule]) throw GrammarError("rule '" + grammar.names[rule] + "' is not defined");
    Thompson t(limits, a.states.size());
    const int start = t.add();
    std::vector<int> called;
    const int end = t.build(*grammar.rules[rule], start, called);
    a.rule_start[rule] = append_rule(a, rule, t, start, end);
    for (const int c : called) {
      if (!queued[c]) {
        queued[c] = 1;
        todo.push_back(c);
      }
    }
  }
  prune_unproductive(a);
  refuse_left_recursion(a);
  for (auto& st : a.states) st.pure_end = st.accept && st.byte_edges.empty() && st.call_edges.empty();
  return a;
}

}  // namespace kvfleet::grammar
