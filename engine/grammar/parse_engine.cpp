#include "engine/grammar/parse_engine.h"

#include <algorithm>

namespace kvfleet::grammar {

ParseEngine::ParseEngine(const Automaton& automaton) : a_(automaton) {
  nodes_.push_back(Node{-1, -1});  // the empty stack
  closure_offset_.push_back(-1);
  closure_size_.push_back(0);
  std::vector<std::int32_t> none;
  intern_set(none);  // set 0: dead
}

std::int32_t ParseEngine::intern_node(std::int32_t parent, std::int32_t state) {
  const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(parent)) << 32) |
                            static_cast<std::uint32_t>(state);
  const auto [it, inserted] = node_ids_.try_emplace(key, static_cast<std::int32_t>(nodes_.size()));
  if (inserted) {
    nodes_.push_back(Node{parent, state});
    closure_offset_.push_back(-1);
    closure_size_.push_back(0);
  }
  return it->second;
}

std::int32_t ParseEngine::intern_set(std::vector<std::int32_t>& members) {
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  std::u32string key(members.begin(), members.end());
  const auto [it, inserted] = set_ids_.try_emplace(std::move(key), static_cast<std::int32_t>(sets_.size()));
  if (inserted) {
    sets_.emplace_back(static_cast<std::uint32_t>(pool_.size()), static_cast<std::uint32_t>(members.size()));
    pool_.insert(pool_.end(), members.begin(), members.end());
    ends_.push_back(!members.empty() && members.front() == kEmptyStack ? 1 : 0);
    trans_.resize(trans_.size() + 256, -1);
    if (it->second == kDead) std::fill(trans_.begin(), trans_.begin() + 256, kDead);
  }
  return it->second;
}

// Everything `stack` stands for once calls are expanded and finished rules popped: stacks waiting for a
// byte, and the empty stack when the whole grammar may end. Iterative with a visited mark, so loops
// over rules that match the empty string terminate (left recursion is refused at build time).
void ParseEngine::closure(std::int32_t stack, std::vector<std::int32_t>& out) {
  if (closure_offset_[stack] < 0) {
    std::vector<std::int32_t> found;
    if (++visit_epoch_ == 0) {
      std::fill(visit_mark_.begin(), visit_mark_.end(), 0);
      visit_epoch_ = 1;
    }
    todo_.assign(1, stack);
    auto visit = [&](std::int32_t id) {
      if (static_cast<std::size_t>(id) >= visit_mark_.size()) visit_mark_.resize(nodes_.size() * 2 + 16, 0);
      if (visit_mark_[id] == visit_epoch_) return;
      visit_mark_[id] = visit_epoch_;
      todo_.push_back(id);
    };
    todo_.clear();
    visit(stack);
    while (!todo_.empty()) {
      const std::int32_t id = todo_.back();
      todo_.pop_back();
      if (id == kEmptyStack) {
        found.push_back(kEmptyStack);
        continue;
      }
      const Node n = nodes_[id];
      const Automaton::State& st = a_.states[n.state];
      if (!st.byte_edges.empty()) found.push_back(id);
      for (const auto& [callee, to] : st.call_edges) {
        const std::int32_t ret = a_.states[to].pure_end ? n.parent : intern_node(n.parent, to);
        visit(intern_node(ret, a_.rule_start[callee]));
      }
      if (st.accept) visit(n.parent);
    }
    closure_offset_[stack] = static_cast<std::int32_t>(closure_pool_.size());
    closure_size_[stack] = static_cast<std::int32_t>(found.size());
    closure_pool_.insert(closure_pool_.end(), found.begin(), found.end());
  }
  const auto* begin = closure_pool_.data() + closure_offset_[stack];
  out.insert(out.end(), begin, begin + closure_size_[stack]);
}

std::int32_t ParseEngine::compute_step(std::int32_t set, std::uint8_t byte) {
  std::vector<std::int32_t> next;
  const auto m = members(set);
  const std::vector<std::int32_t> current(m.begin(), m.end());  // members() may move as sets are added
  for (const std::int32_t id : current) {
    if (id == kEmptyStack) continue;
    const Node n = nodes_[id];
    for (const auto& [bytes, to] : a_.states[n.state].byte_edges) {
      if (!bytes.test(byte)) continue;
      if (a_.states[to].pure_end) {
        if (n.parent == kEmptyStack) next.push_back(kEmptyStack);
        else closure(n.parent, next);
      } else {
        closure(intern_node(n.parent, to), next);
      }
    }
  }
  return intern_set(next);
}

std::int32_t ParseEngine::root_set() {
  if (root_set_ < 0) {
    std::vector<std::int32_t> m;
    closure(intern_node(kEmptyStack, a_.rule_start[a_.root]), m);
    root_set_ = intern_set(m);
  }
  return root_set_;
}

std::int32_t ParseEngine::position_set(std::int32_t state) { return singleton(intern_node(kEmptyStack, state)); }

std::int32_t ParseEngine::singleton(std::int32_t stack) {
  std::vector<std::int32_t> m{stack};
  return intern_set(m);
}

std::size_t ParseEngine::memory_bytes() const {
  return nodes_.size() * (sizeof(Node) + 32) + closure_pool_.size() * 4 + pool_.size() * 4 + trans_.size() * 4 +
         sets_.size() * 48;
}

}  // namespace kvfleet::grammar
