// MaskWorker: every job of a step is filled by the time wait() returns, whichever thread claimed it; a
// matcher that throws sets its job's error; the job list is reused step after step, as the engine does.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "engine/runtime/mask_worker.h"

using namespace kvfleet;

namespace {

class CountingMatcher final : public TokenMatcher {
 public:
  explicit CountingMatcher(int sleep_us, bool throws = false) : sleep_us_(sleep_us), throws_(throws) {}
  void fill_next_token_mask(std::span<std::uint32_t> mask) override {
    if (sleep_us_) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (throws_) throw std::runtime_error("boom");
    ++fills;
    std::fill(mask.begin(), mask.end(), static_cast<std::uint32_t>(fills));
  }
  bool accept_token(TokenId) override { return true; }
  void rollback(std::size_t) override {}
  bool is_terminated() const override { return false; }
  int fills = 0;

 private:
  int sleep_us_;
  bool throws_;
};

}  // namespace

TEST_CASE("MaskWorker fills every job of every step, with the engine thread helping when it waits") {
  MaskWorker worker;
  worker.wait();  // nothing started: returns at once
  std::vector<CountingMatcher> matchers;
  for (int i = 0; i < 6; ++i) matchers.emplace_back(i % 2 ? 300 : 0);
  matchers.emplace_back(0, true);
  std::vector<std::vector<std::uint32_t>> masks(matchers.size(), std::vector<std::uint32_t>(4, 0u));
  std::vector<std::string> errors(matchers.size());
  std::vector<MaskJob> jobs;
  for (int step = 1; step <= 200; ++step) {
    jobs.clear();
    const std::size_t n = 1 + static_cast<std::size_t>(step) % matchers.size();  // 1 to 7 rows this step
    for (std::size_t i = 0; i < n; ++i) jobs.push_back({&matchers[i], &masks[i], &errors[i]});
    std::vector<int> before;
    for (const auto& m : matchers) before.push_back(m.fills);
    worker.start(jobs);
    if (step % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));  // a "forward"
    worker.wait();
    for (std::size_t i = 0; i + 1 < matchers.size(); ++i) {
      CAPTURE(step);
      CAPTURE(i);
      CHECK(matchers[i].fills == before[i] + (i < n ? 1 : 0));  // this step's jobs once each, no other
      if (i < n) CHECK(masks[i][3] == static_cast<std::uint32_t>(matchers[i].fills));
    }
  }
  CHECK(matchers[0].fills == 200);
  CHECK(errors.back() == "constrained decoding: the grammar failed: boom");
}
