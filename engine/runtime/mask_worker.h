// Constrained decoding's per-step work off the engine thread: the allowed-token masks of the step's
// constrained rows are filled on this worker while the step's forward pass runs, so a grammar's cost
// overlaps the model's instead of adding to every sequence's step time. Rows are claimed one at a time
// from a shared counter: when the forward ends first, wait() fills the rows the worker has not reached on
// the engine thread itself, so a late worker (a busy machine) never costs more than the serial work.
//
// Thread-safety: start() and wait() are called by the engine thread only. Between them the jobs' matchers
// and masks belong to whichever thread claimed them; the engine thread uses them again after wait().
#pragma once

#include <atomic>
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
  // Fills the jobs no thread has claimed yet, then blocks until the worker's current one is done; returns at
  // once when none are pending.
  void wait();

 private:
  struct Step {
    std::uint64_t generation = 0;
    const MaskJob* jobs = nullptr;
    std::size_t size = 0;
  };
  void run();
  void drain(const Step& step);  // claims and fills jobs of `step` until none are left

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  Step step_;                      // guarded by mu_ (the engine thread also reads it between start and wait)
  std::uint64_t generation_ = 0;   // guarded by mu_: one per start()
  bool posted_ = false;            // guarded by mu_: a step waits for the worker to pick it up
  bool stop_ = false;              // guarded by mu_
  // generation << 32 | the next unclaimed job: a claim of an earlier generation fails, so a worker that
  // wakes after its step ended never touches the next step's jobs.
  std::atomic<std::uint64_t> ticket_{0};
  std::atomic<std::size_t> done_{0};  // jobs of the current step filled
};

}  // namespace kvfleet
