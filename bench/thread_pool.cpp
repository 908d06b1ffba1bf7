// The cost of one parallel_for hand-off and return: the kernels' ThreadPool (spin, then futex) against the
// mutex + condition variable pool it replaced (copied here verbatim as LegacyPool), interleaved A, B, A, B
// in one run so that the machine's load hits both alike.
//
//   build/bin/bench_thread_pool [--threads 2] [--ops 20000] [--rounds 4]
//
// Each op is parallel_for(n = threads, grain 1) over a trivial body: what remains is the hand-off (in
// today's pool a caller that finds the worker slow to start may run every chunk itself: it never waits
// for a thread with nothing claimed). Then ops with work: n = 4 x threads items of ~5 us each, reported
// as the time beyond the ideal split (items x 5 us / threads): hand-off plus the wait for the slowest. Last,
// today's pool notifying on every op (ThreadPool::set_notify_always) against only a sleeping thread.
#include <algorithm>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
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

// The pool at a14c1fc (static split, one range per thread, the caller waits for every worker to check in),
// copied verbatim but for the class around it: what today's chunk claiming is compared with.
namespace previous {
// The number of runnable threads on the machine right now (/proc/stat's procs_running, which counts this
// process's running and spinning threads too), or -1 where it cannot be read.
long procs_running() {
  std::FILE* f = std::fopen("/proc/stat", "re");
  if (!f) return -1;
  long n = -1;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "procs_running ", 14) == 0) {
      n = std::strtol(line + 14, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return n;
}

// Whether spinning pays now. With KVFLEET_POOL_SPIN_US set: always (the user chose). Otherwise only while
// no more threads want to run than there are cores: a spinning thread on an oversubscribed machine holds a
// core that the thread it waits for needs (measured: on the loaded 2-core VM every spin lost; on the quiet
// one a 100 us spin made batch-1 decode 1.5x faster). Re-checked every 20 ms by whichever thread comes first.
bool spin_allowed() {
  static const bool forced = [] {
    const char* env = std::getenv("KVFLEET_POOL_SPIN_US");
    return env && *env;
  }();
  if (forced) return true;
  static const long cores = std::max(1u, std::thread::hardware_concurrency());
  static std::atomic<std::int64_t> next_check{0};
  static std::atomic<bool> allowed{false};
  const std::int64_t now = Clock::now().time_since_epoch().count();
  std::int64_t due = next_check.load(std::memory_order_relaxed);
  if (now >= due && next_check.compare_exchange_strong(due, now + 20'000'000, std::memory_order_relaxed)) {
    const long running = procs_running();
    // One more than the cores: the count includes this reading thread and often a transient kernel thread.
    allowed.store(running > 0 && running <= cores + 1, std::memory_order_relaxed);
  }
  return allowed.load(std::memory_order_relaxed);
}

// Spins until pred() holds or spin_time() has passed; true if pred() held. The clock is read every 64
// pauses only.
template <class Pred>
bool spin_until(Pred pred) {
  static const auto spin = kvfleet::ThreadPool::spin_time();
  if (spin.count() <= 0 || !spin_allowed()) return pred();
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

class PreviousPool {
 public:
  explicit PreviousPool(unsigned threads) {
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
  }
  ~PreviousPool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
  }
  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }
  void parallel_for(std::int64_t n, std::int64_t grain,
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

  void worker(unsigned index) {
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

 private:
  std::vector<std::thread> workers_;
  const std::function<void(std::int64_t, std::int64_t)>* job_ = nullptr;
  std::int64_t job_n_ = 0, job_chunk_ = 0;
  unsigned job_parts_ = 0;
  alignas(64) std::atomic<std::uint64_t> generation_{0};
  alignas(64) std::atomic<unsigned> pending_{0};
  std::atomic<bool> stop_{false};
};
}  // namespace previous

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
  previous::PreviousPool prev(threads);
  double work_old = 1e30, work_prev = 1e30, work_new = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const double old_us = overhead_per_work_op(legacy, ops / 10), prev_us = overhead_per_work_op(prev, ops / 10);
    const double new_us = overhead_per_work_op(pool, ops / 10);
    work_old = std::min(work_old, old_us);
    work_prev = std::min(work_prev, prev_us);
    work_new = std::min(work_new, new_us);
    std::printf("round %d, ops of %u x 5 us, beyond the ideal split: mutex+condvar %8.2f us/op, a14c1fc's %8.2f, "
                "today's %8.2f\n", r, 4 * pool.size(), old_us, prev_us, new_us);
  }
  std::printf("best beyond the ideal: mutex+condvar %.2f us/op, a14c1fc's %.2f, today's %.2f\n", work_old, work_prev,
              work_new);
  // Today's pool notifying on every op (as before the sleeper counts: libstdc++ makes that a futex system
  // call whenever any thread of the process waits on an atomic in the same slot of its waiter table) against
  // only when one of its threads sleeps, with another pool's workers asleep in the process, as the old pools'
  // are here by now.
  kvfleet::ThreadPool asleep(4);
  asleep.parallel_for(4, 1, [](std::int64_t, std::int64_t) {});
  double best_bare[2] = {1e30, 1e30}, best_work[2] = {1e30, 1e30};  // [1]: notifying on every op
  for (int r = 0; r < rounds; ++r) {
    for (const int always : {1, 0}) {
      kvfleet::ThreadPool::set_notify_always(always == 1);
      const double bare = us_per_op(pool, ops), work = overhead_per_work_op(pool, ops / 10);
      best_bare[always] = std::min(best_bare[always], bare);
      best_work[always] = std::min(best_work[always], work);
      std::printf("round %d, today's pool notifying %s: %8.2f us/op bare, %8.2f beyond the ideal with work\n", r,
                  always ? "on every op      " : "only a sleeper   ", bare, work);
    }
  }
  kvfleet::ThreadPool::set_notify_always(false);
  std::printf("best, notifying on every op / only a sleeper: bare %.2f / %.2f us/op, with work %.2f / %.2f us/op\n",
              best_bare[1], best_bare[0], best_work[1], best_work[0]);
  return 0;
}
