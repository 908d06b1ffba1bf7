// Multi-pattern matching of stop strings over text that arrives piece by piece (Aho-Corasick): the cost
// of a piece is its length, whatever the number of stop strings, and a match that spans pieces (tokens)
// is found as well as one inside a piece.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvfleet {

class StopMatcher {
 public:
  StopMatcher() = default;
  // Empty patterns never match.
  explicit StopMatcher(const std::vector<std::string>& patterns);

  // Feeds the next piece of text. Returns the index of the pattern that ends inside `piece` (with the
  // lowest index when several do), or -1. The state carries over to the next call.
  int feed(std::string_view piece);

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> next;  // sorted by byte
    std::int32_t fail = 0;
    std::int32_t best = -1;  // lowest pattern index ending here or at any suffix of this node
  };
  std::int32_t child(std::int32_t node, unsigned char c) const;
  std::int32_t step(std::int32_t node, unsigned char c) const;

  std::vector<Node> nodes_;
  std::int32_t state_ = 0;
};

}  // namespace kvfleet
