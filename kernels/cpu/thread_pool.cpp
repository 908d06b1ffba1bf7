#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>

namespace kvfleet {
namespace {

using Clock = std::chrono::steady_clock;

// Spins until pred() holds or spin_time() has passed; true if pred() held. The clock is read every 64
// pauses only.
template <class Pred>
bool spin_until(Pred pred) {
  static const auto spin = ThreadPool::spin_time();
  const auto deadline = Clock::now() + spin;
  for (unsigned i = 1;; ++i) {
    if (pred()) return true;
    _mm_pause();
    if (i % 64 == 0) {
      if (Clock::now() > deadline) return pred();
      // Past the first few microseconds, let a thread that shares this core (maybe the one awaited) run.
      if (i >= 1024) std::this_thread::yield();
    }
  }
}

}  // namespace

std::chrono::microseconds ThreadPool::spin_time() {
  static const std::chrono::microseconds us = [] {
    const char* env = std::getenv("KVFLEET_POOL_SPIN_US");
    return std::chrono::microseconds(env && *env ? std::strtol(env, nullptr, 10) : 0);
  }();
  return us;
}

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
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
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = (n + parts - 1) / parts;
  job_parts_ = static_cast<unsigned>(parts);
  pending_.store(static_cast<unsigned>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);  // publishes job_* and pending_
  generation_.notify_all();                             // no syscall when no worker sleeps
  fn(0, std::min(job_chunk_, n));                       // the caller's share: index 0
  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    for (unsigned p; (p = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(p, std::memory_order_acquire);
  }
  job_ = nullptr;
}

void ThreadPool::worker(unsigned index) {
  std::uint64_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;  // woken (or spuriously): check again, spinning first
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_relaxed)) return;
    // Threads beyond the job's parts (a small n) have nothing to do but must still check in.
    if (index < job_parts_) {
      const std::int64_t begin = index * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
      if (begin < end) (*job_)(begin, end);
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace kvfleet
