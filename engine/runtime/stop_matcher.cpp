#include "engine/runtime/stop_matcher.h"

#include <algorithm>
#include <deque>

namespace kvfleet {

StopMatcher::StopMatcher(const std::vector<std::string>& patterns) {
  nodes_.emplace_back();
  for (std::size_t p = 0; p < patterns.size(); ++p) {
    if (patterns[p].empty()) continue;
    std::int32_t node = 0;
    for (const unsigned char c : patterns[p]) {
      std::int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<std::int32_t>(nodes_.size());
        auto& edges = nodes_[static_cast<std::size_t>(node)].next;
        edges.insert(std::lower_bound(edges.begin(), edges.end(), std::pair{c, std::int32_t{-1}}), {c, next});
        nodes_.emplace_back();
      }
      node = next;
    }
    auto& best = nodes_[static_cast<std::size_t>(node)].best;
    if (best < 0) best = static_cast<std::int32_t>(p);  // a duplicate keeps the lower index
  }
  // Breadth first, so that a node's failure target (a shorter string) is complete before the node.
  std::deque<std::int32_t> queue;
  for (const auto& [c, n] : nodes_[0].next) queue.push_back(n);
  while (!queue.empty()) {
    const std::int32_t node = queue.front();
    queue.pop_front();
    for (const auto& [c, n] : nodes_[static_cast<std::size_t>(node)].next) {
      std::int32_t f = nodes_[static_cast<std::size_t>(node)].fail;
      Node& target = nodes_[static_cast<std::size_t>(n)];
      target.fail = node == 0 ? 0 : step(f, c);
      const std::int32_t inherited = nodes_[static_cast<std::size_t>(target.fail)].best;
      if (inherited >= 0 && (target.best < 0 || inherited < target.best)) target.best = inherited;
      queue.push_back(n);
    }
  }
}

std::int32_t StopMatcher::child(std::int32_t node, unsigned char c) const {
  const auto& edges = nodes_[static_cast<std::size_t>(node)].next;
  const auto it = std::lower_bound(edges.begin(), edges.end(), std::pair{c, std::int32_t{-1}});
  return it != edges.end() && it->first == c ? it->second : -1;
}

std::int32_t StopMatcher::step(std::int32_t node, unsigned char c) const {
  for (;;) {
    if (const std::int32_t next = child(node, c); next >= 0) return next;
    if (node == 0) return 0;
    node = nodes_[static_cast<std::size_t>(node)].fail;
  }
}

int StopMatcher::feed(std::string_view piece) {
  if (nodes_.empty()) return -1;
  int found = -1;
  for (const unsigned char c : piece) {
    state_ = step(state_, c);
    const std::int32_t best = nodes_[static_cast<std::size_t>(state_)].best;
    if (best >= 0 && (found < 0 || best < found)) found = best;
  }
  return found;
}

}  // namespace kvfleet
