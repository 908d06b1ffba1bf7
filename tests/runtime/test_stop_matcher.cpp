// StopMatcher (Aho-Corasick over the decoded text) against the matcher it replaced: for every piece, the
// first stop string in the request's order that ends inside the piece, however the text is cut.
#include <doctest/doctest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/stop_matcher.h"

using namespace kvfleet;

namespace {

// The previous StopChecker's loop, kept as the reference: a find over the tail for each stop string.
class ReferenceMatcher {
 public:
  explicit ReferenceMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  int feed(const std::string& piece) {
    const std::size_t old_size = text_.size();
    text_ += piece;
    for (std::size_t i = 0; i < stops_.size(); ++i) {
      const std::string& s = stops_[i];
      const std::size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
      if (!s.empty() && text_.find(s, from) != std::string::npos) return static_cast<int>(i);
    }
    return -1;
  }

 private:
  std::vector<std::string> stops_;
  std::string text_;
};

std::string random_text(std::mt19937& rng, std::size_t n, const std::string& alphabet) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
  return s;
}

}  // namespace

TEST_CASE("StopMatcher finds what the per-string search found, piece by piece, across piece boundaries") {
  std::mt19937 rng(1234);
  const std::string alphabet = "abcab\xc3\xa9 ";  // few letters: many overlapping, nested, repeated matches
  int matched = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::string> stops;
    const int count = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < count; ++i) stops.push_back(random_text(rng, rng() % 5, alphabet));  // empty ones too
    StopMatcher fast(stops);
    ReferenceMatcher slow(stops);
    const std::string text = random_text(rng, 40, alphabet);
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t len = std::min<std::size_t>(rng() % 4, text.size() - at);  // empty pieces too
      const std::string piece = text.substr(at, len);
      at += len;
      const int expected = slow.feed(piece);
      CAPTURE(round);
      REQUIRE(fast.feed(piece) == expected);
      if (expected >= 0) {
        ++matched;
        break;  // a request ends at its first stop
      }
    }
  }
  CHECK(matched > 500);  // the cases exercised matches, not only misses
}

TEST_CASE("StopMatcher: duplicates keep the first index; a suffix match inside a longer pattern is found") {
  StopMatcher m({"xyz", "bc", "abcd", "bc"});
  CHECK(m.feed("a") == -1);
  CHECK(m.feed("b") == -1);
  CHECK(m.feed("c") == 1);  // "bc" ends here, although "abcd" is still open
  StopMatcher none({"", ""});
  CHECK(none.feed("anything") == -1);
}

TEST_CASE("StopMatcher's cost per piece does not grow with the number of stop strings") {
  auto time_with = [](std::size_t count) {
    std::vector<std::string> stops;
    for (std::size_t i = 0; i < count; ++i) stops.push_back("stop-" + std::to_string(i * 7919) + "-end");
    StopMatcher m(stops);
    const auto start = std::chrono::steady_clock::now();
    int hits = 0;
    for (int i = 0; i < 20000; ++i) hits += m.feed("text 12345 ") >= 0;
    CHECK(hits == 0);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double few = time_with(4), many = time_with(10000);
  CAPTURE(few);
  CAPTURE(many);
  CHECK(many < few * 10 + 0.05);  // the per-string search was ~2,500x slower here
}
