// Constrained decoding's per-step work off the engine thread: the allowed-token masks of the step's
// constrained rows are filled on this worker while the step's forward pass runs, so a grammar's cost
// overlaps the model's instead of adding to every sequence's step time.
//
// Thread-safety: start() and wait() are called by the engine thread only. Between them the jobs' matchers
// and masks belong to the worker; the engine thread touches them again only after wait() returns.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvfleet/token_constraint.h"

namespace kvfleet {

struct MaskJob {
  TokenMatcher* matcher;
  std::vector<std::uint32_t>* mask;  // resized to the grammar's bitmask_words(vocab) by the caller
  std::string* error;                // set when the matcher throws (that request fails, not the step)
};

class MaskWorker {
 public:
  MaskWorker() = default;
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;
  ~MaskWorker();

  // Begins filling every job's mask and returns at once (the thread starts on the first call). `jobs` must
  // stay alive and unchanged until wait().
  void start(const std::vector<MaskJob>& jobs);
  // Blocks until the jobs of the last start() are done; returns at once when none are pending.
  void wait();

 private:
  void run();

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::vector<MaskJob>* jobs_ = nullptr;  // guarded by mu_: pending work
  bool busy_ = false;                           // guarded by mu_: started and not yet done
  bool stop_ = false;
};

}  // namespace kvfleet
