#include "engine/runtime/mask_worker.h"

#include <exception>
#include <utility>

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
    jobs_ = &jobs;
    busy_ = true;
  }
  cv_.notify_all();
}

void MaskWorker::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
}

void MaskWorker::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || jobs_; });
    if (stop_) return;
    const std::vector<MaskJob>& jobs = *std::exchange(jobs_, nullptr);
    lock.unlock();
    for (const MaskJob& j : jobs) {
      try {
        j.matcher->fill_next_token_mask(*j.mask);
      } catch (const std::exception& e) {
        *j.error = std::string("constrained decoding: the grammar failed: ") + e.what();
      } catch (...) {
        *j.error = "constrained decoding: the grammar failed";
      }
    }
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace kvfleet
