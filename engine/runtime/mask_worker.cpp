#include "engine/runtime/mask_worker.h"

#include <exception>

namespace kvfleet {

MaskWorker::~MaskWorker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MaskWorker::start(const std::vector<MaskJob>& jobs) {
  if (jobs.empty()) return;
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  {
    std::lock_guard lock(mu_);
    ++generation_;
    step_ = {generation_, jobs.data(), jobs.size()};
    done_.store(0);
    ticket_.store(generation_ << 32);
    posted_ = true;
  }
  cv_.notify_all();
}

// Claims job after job of `step` until none is left, or the step is over: a ticket of another generation
// (a worker that woke late) claims nothing and reads no job.
void MaskWorker::drain(const Step& step) {
  for (;;) {
    std::uint64_t t = ticket_.load();
    do {
      if ((t >> 32) != step.generation || (t & 0xffffffffu) >= step.size) return;
    } while (!ticket_.compare_exchange_weak(t, t + 1));
    const MaskJob& j = step.jobs[t & 0xffffffffu];
    try {
      j.matcher->fill_next_token_mask(*j.mask);
    } catch (const std::exception& e) {
      *j.error = std::string("constrained decoding: the grammar failed: ") + e.what();
    } catch (...) {
      *j.error = "constrained decoding: the grammar failed";
    }
    if (done_.fetch_add(1) + 1 == step.size) {
      std::lock_guard lock(mu_);  // the waiter checks done_ under mu_: no lost wake-up
      cv_.notify_all();
    }
  }
}

void MaskWorker::wait() {
  if (!step_.jobs) return;
  drain(step_);  // whatever the worker has not reached, on this thread
  std::unique_lock lock(mu_);
  posted_ = false;
  cv_.wait(lock, [&] { return done_.load() == step_.size; });
  step_ = {};
}

void MaskWorker::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || posted_; });
    if (stop_) return;
    posted_ = false;
    const Step step = step_;
    lock.unlock();
    drain(step);
    lock.lock();
  }
}

}  // namespace kvfleet
