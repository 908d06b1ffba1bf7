#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace kvfleet {

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(std::int64_t n, std::int64_t grain,
                              const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  const std::int64_t max_parts = std::max<std::int64_t>(1, n / std::max<std::int64_t>(1, grain));
  const auto parts = std::min<std::int64_t>(size(), max_parts);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  const std::int64_t chunk = (n + parts - 1) / parts;
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    pending_ = static_cast<unsigned>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  fn(0, std::min(chunk, n));  // the caller's share: index 0
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker(unsigned index) {
  std::uint64_t seen = 0;
  for (;;) {
    std::unique_lock lock(mu_);
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* fn = job_;
    const std::int64_t begin = index * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
    lock.unlock();
    if (begin < end) (*fn)(begin, end);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace kvfleet
