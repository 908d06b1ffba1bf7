#include "engine/grammar/automaton.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

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

// Bottom-up: states with the same signature (rule, acceptance, byte sets per merged target, calls with
// merged return states) merge, until no signature changes.
void merge_equivalent_states(Automaton& a) {
  static_assert(sizeof(ByteSet) == 4 * sizeof(std::uint64_t));
  const std::size_t n = a.states.size();
  std::vector<std::int32_t> rep(n);
  for (std::size_t s = 0; s < n; ++s) rep[s] = static_cast<std::int32_t>(s);
  struct Hash {
    std::size_t operator()(const std::vector<std::uint64_t>& v) const {
      std::uint64_t h = 0x9E3779B97F4A7C15ull;
      for (const std::uint64_t x : v) h = (h ^ x) * 0xBF58476D1CE4E5B9ull + (h >> 29);
      return static_cast<std::size_t>(h);
    }
  };
  auto find = [&](std::int32_t x) {
    while (rep[x] != x) x = rep[x] = rep[rep[x]];
    return x;
  };
  std::vector<std::vector<std::int32_t>> preds(n);
  for (std::size_t s = 0; s < n; ++s) {
    for (const auto& e : a.states[s].byte_edges) preds[e.second].push_back(static_cast<std::int32_t>(s));
    for (const auto& e : a.states[s].call_edges) preds[e.second].push_back(static_cast<std::int32_t>(s));
  }
  // A worklist: a state's signature changes only when one of its targets merges, so after the first
  // round only the predecessors of merged states are looked at again. An entry of `seen` whose targets
  // have merged since is stale but harmless: a fresh signature names only unmerged states.
  std::unordered_map<std::vector<std::uint64_t>, std::int32_t, Hash> seen;
  seen.reserve(n);
  std::vector<std::vector<std::uint64_t>> sig_of(n);
  std::vector<std::pair<std::int32_t, ByteSet>> edges;
  std::vector<std::pair<std::int32_t, std::int32_t>> calls;
  std::vector<std::int32_t> dirty(n), next;
  for (std::size_t s = 0; s < n; ++s) dirty[s] = static_cast<std::int32_t>(s);
  while (!dirty.empty()) {
    next.clear();
    for (const std::int32_t s : dirty) {
      if (rep[s] != s) continue;
      const auto& st = a.states[static_cast<std::size_t>(s)];
      edges.clear();
      for (const auto& [set, to] : st.byte_edges) edges.emplace_back(find(to), set);
      std::sort(edges.begin(), edges.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      std::vector<std::uint64_t> sig{static_cast<std::uint64_t>(st.rule), st.accept ? 1u : 0u, edges.size()};
      for (std::size_t i = 0; i < edges.size();) {
        ByteSet set = edges[i].second;
        std::size_t j = i + 1;
        for (; j < edges.size() && edges[j].first == edges[i].first; ++j) set |= edges[j].second;
        std::uint64_t words[4];
        std::memcpy(words, &set, sizeof words);
        sig.push_back(static_cast<std::uint64_t>(edges[i].first));
        sig.insert(sig.end(), words, words + 4);
        i = j;
      }
      calls.clear();
      for (const auto& [callee, to] : st.call_edges) calls.emplace_back(callee, find(to));
      std::sort(calls.begin(), calls.end());
      calls.erase(std::unique(calls.begin(), calls.end()), calls.end());
      sig.push_back(~std::uint64_t{0});
      for (const auto& [callee, to] : calls) sig.push_back((static_cast<std::uint64_t>(callee) << 32) | static_cast<std::uint32_t>(to));
      auto& mine = sig_of[static_cast<std::size_t>(s)];
      if (sig == mine) continue;
      if (!mine.empty()) {
        if (const auto old = seen.find(mine); old != seen.end() && old->second == s) seen.erase(old);
      }
      const auto [it, inserted] = seen.try_emplace(sig, s);
      if (inserted) {
        mine = std::move(sig);
      } else {
        rep[s] = it->second;
        mine.clear();
        next.insert(next.end(), preds[static_cast<std::size_t>(s)].begin(), preds[static_cast<std::size_t>(s)].end());
      }
    }
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    dirty.swap(next);
  }
  for (std::size_t s = 0; s < n; ++s) rep[s] = find(static_cast<std::int32_t>(s));
  std::vector<std::int32_t> id(n, -1);
  std::int32_t count = 0;
  for (std::size_t s = 0; s < n; ++s) {
    if (rep[s] == static_cast<std::int32_t>(s)) id[s] = count++;
  }
  std::vector<Automaton::State> merged(static_cast<std::size_t>(count));
  for (std::size_t s = 0; s < n; ++s) {
    if (id[s] < 0) continue;
    auto& m = merged[static_cast<std::size_t>(id[s])];
    m = std::move(a.states[s]);
    for (auto& e : m.byte_edges) e.second = id[rep[e.second]];
    for (std::size_t i = 0; i < m.byte_edges.size(); ++i) {  // edges that now share a target
      for (std::size_t j = m.byte_edges.size(); j-- > i + 1;) {
        if (m.byte_edges[j].second == m.byte_edges[i].second) {
          m.byte_edges[i].first |= m.byte_edges[j].first;
          m.byte_edges.erase(m.byte_edges.begin() + static_cast<std::ptrdiff_t>(j));
        }
      }
    }
    for (auto& e : m.call_edges) e.second = id[rep[e.second]];
    std::sort(m.call_edges.begin(), m.call_edges.end());
    m.call_edges.erase(std::unique(m.call_edges.begin(), m.call_edges.end()), m.call_edges.end());
  }
  for (auto& start : a.rule_start) {
    if (start >= 0) start = id[rep[start]];
  }
  a.states = std::move(merged);
}

}  // namespace kvfleet::grammar
