// A fixed pool of worker threads for the CPU kernels. parallel_for splits [0, n) into contiguous ranges,
// one per thread; the split never changes what any single output element computes, so results do not
// depend on the number of threads (the kernels are batch- and thread-invariant by construction).
// Thread-safety: one caller at a time (the engine thread owns the pool).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
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

 private:
  void worker(unsigned index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(std::int64_t, std::int64_t)>* job_ = nullptr;
  std::int64_t job_n_ = 0, job_chunk_ = 0;
  std::uint64_t generation_ = 0;
  unsigned pending_ = 0;
  bool stop_ = false;
};

}  // namespace kvfleet
