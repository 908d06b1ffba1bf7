// Runs requests through an Engine and collects their outputs, for the engine tests.
#pragma once

#include <map>
#include <mutex>
#include <vector>

#include "kvfleet/engine.h"

namespace kvfleet::test {

struct Collected {
  std::vector<TokenId> tokens;
  FinishReason reason = FinishReason::none;
  std::int32_t cached_tokens = 0;
  int finals = 0;  // how many outputs said finished (must be exactly 1)
};

class Collector {
 public:
  OutputCallback callback(std::size_t index) {
    return [this, index](const RequestOutput& o) {
      std::lock_guard lock(mu_);
      Collected& c = results_[index];
      c.tokens.insert(c.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) {
        c.reason = o.finish_reason;
        c.cached_tokens = o.num_cached_tokens;
        ++c.finals;
      }
    };
  }
  std::map<std::size_t, Collected> results() {
    std::lock_guard lock(mu_);
    return results_;
  }

 private:
  std::mutex mu_;
  std::map<std::size_t, Collected> results_;
};

}  // namespace kvfleet::test
