// A fixed pool of worker threads for the CPU kernels. parallel_for splits [0, n) into contiguous ranges,
// one per thread; the split depends only on n, grain and the pool size (never on timing), and it never
// changes what any single output element computes, so results do not depend on the number of threads (the
// kernels are batch- and thread-invariant by construction).
//
// Hand-off: a decode step is ~100 ops of tens of microseconds each, so waking a worker through a mutex and a
// condition variable (60-85 us per op on a VM, issue 20) costs as much as the work. Workers and the caller
// instead wait on an atomic generation counter / pending count: a short spin (spin_time(), when the machine
// has a free core), then
// std::atomic::wait (a futex). Between steps the workers fall asleep and cost nothing.
// Thread-safety: one caller at a time (the engine thread owns the pool).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace kvfleet {

class ThreadPool {
 public:
  // threads == 0: one per hardware thread.
  explicit ThreadPool(unsigned threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), in parallel, each at least `grain` long
  // (except the last), and returns when all are done. The caller's thread does one share.
  void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& fn);

  // How long a waiting thread spins on its own before std::atomic::wait (which itself spins a few
  // iterations and yields before its futex): KVFLEET_POOL_SPIN_US, read once (0: never spin). Unset, the
  // default is 100 us, but only while the machine has no more runnable threads than cores (/proc/stat,
  // checked every 20 ms): on the quiet 2-core VM that spin made batch-1 decode 1.5x faster, on the
  // oversubscribed one every spin lost (a spinning thread holds a core the thread it waits for needs).
  static std::chrono::microseconds spin_time();

 private:
  void worker(unsigned index);

  std::vector<std::thread> workers_;
  const std::function<void(std::int64_t, std::int64_t)>* job_ = nullptr;
  std::int64_t job_n_ = 0, job_chunk_ = 0;
  unsigned job_parts_ = 0;
  // generation_ publishes a job (release) to the workers; pending_ counts the workers still running it.
  alignas(64) std::atomic<std::uint64_t> generation_{0};
  alignas(64) std::atomic<unsigned> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace kvfleet
