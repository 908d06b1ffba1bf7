// The cost of one parallel_for hand-off and return: the kernels' ThreadPool (spin, then futex) against the
// mutex + condition variable pool it replaced (copied here verbatim as LegacyPool), interleaved A, B, A, B
// in one run so that the machine's load hits both alike.
//
//   build/bin/bench_thread_pool [--threads 2] [--ops 20000] [--rounds 4]
//
// Each op is parallel_for(n = threads, grain 1) over a trivial body: what remains is the hand-off (in
// today's pool a caller that finds the worker slow to start may run every chunk itself: it never waits
// for a thread with nothing claimed). Then ops with work: n = 4 x threads items of ~5 us each, reported
// as the time beyond the ideal split (items x 5 us / threads): hand-off plus the wait for the slowest.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"

using Clock = std::chrono::steady_clock;

namespace {

class LegacyPool {  // kernels/cpu/thread_pool.cpp at 6c45467
 public:
  explicit LegacyPool(unsigned threads) {
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
  }
  ~LegacyPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }
  void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& fn) {
    if (n <= 0) return;
    const std::int64_t max_parts = std::max<std::int64_t>(1, n / std::max<std::int64_t>(1, grain));
    const auto parts = std::min<std::int64_t>(size(), max_parts);
    if (parts <= 1) return fn(0, n);
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
    fn(0, std::min(chunk, n));
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void worker(unsigned index) {
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
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(std::int64_t, std::int64_t)>* job_ = nullptr;
  std::int64_t job_n_ = 0, job_chunk_ = 0;
  std::uint64_t generation_ = 0;
  unsigned pending_ = 0;
  bool stop_ = false;
};

template <class Pool>
double us_per_op(Pool& pool, int ops) {
  std::vector<std::int64_t> hits(pool.size() * 8, 0);
  const std::function<void(std::int64_t, std::int64_t)> body = [&](std::int64_t b, std::int64_t) { ++hits[b * 8]; };
  const auto t0 = Clock::now();
  for (int i = 0; i < ops; ++i) pool.parallel_for(pool.size(), 1, body);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / ops;
  for (unsigned t = 0; t < pool.size(); ++t)
    if (hits[t * 8] != ops) std::printf("error: part %u ran %lld times\n", t, static_cast<long long>(hits[t * 8]));
  return us;
}

void busy(std::chrono::microseconds us) {
  const auto end = Clock::now() + us;
  while (Clock::now() < end) {
  }
}

// Microseconds per op beyond the ideal, for ops of 4 x size() items of 5 us.
template <class Pool>
double overhead_per_work_op(Pool& pool, int ops) {
  const std::int64_t n = 4 * pool.size();
  const std::function<void(std::int64_t, std::int64_t)> body = [&](std::int64_t b, std::int64_t e) {
    busy(std::chrono::microseconds(5 * (e - b)));
  };
  const auto t0 = Clock::now();
  for (int i = 0; i < ops; ++i) pool.parallel_for(n, 1, body);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / ops;
  return us - 5.0 * static_cast<double>(n) / pool.size();
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 2;
  int ops = 20000, rounds = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else if (a == "--ops") ops = std::stoi(argv[i + 1]);
    else if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
  }
  LegacyPool legacy(threads);
  kvfleet::ThreadPool pool(threads);
  std::printf("threads %u, %d ops per measurement\n", threads, ops);
  double best_old = 1e30, best_new = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const double old_us = us_per_op(legacy, ops), new_us = us_per_op(pool, ops);
    best_old = std::min(best_old, old_us);
    best_new = std::min(best_new, new_us);
    std::printf("round %d: mutex+condvar %8.2f us/op   spin+futex %8.2f us/op\n", r, old_us, new_us);
  }
  std::printf("best: mutex+condvar %.2f us/op, spin+futex %.2f us/op, %.1fx\n", best_old, best_new, best_old / best_new);
  double work_old = 1e30, work_new = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const double old_us = overhead_per_work_op(legacy, ops / 10), new_us = overhead_per_work_op(pool, ops / 10);
    work_old = std::min(work_old, old_us);
    work_new = std::min(work_new, new_us);
    std::printf("round %d, ops of %u x 5 us: beyond the ideal split: mutex+condvar %8.2f us/op   spin+futex %8.2f us/op\n", r,
                4 * pool.size(), old_us, new_us);
  }
  std::printf("best beyond the ideal: mutex+condvar %.2f us/op, spin+futex %.2f us/op\n", work_old, work_new);
  return 0;
}
