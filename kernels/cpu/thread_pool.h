// A fixed pool of worker threads for the CPU kernels. parallel_for cuts [0, n) into contiguous chunks, a
// few per thread, that the threads claim in order through one atomic word: a thread that is done (or a
// worker the OS has not run yet) leaves the rest to the others, so no thread waits at the end of an op
// for one that was slower or descheduled. Which thread runs a chunk never changes what any single output
// element computes, so results do not depend on the number of threads or on timing (the kernels are
// batch- and thread-invariant by construction); the chunk boundaries depend only on n, grain and the
// pool size (and a tapered op's tail: parallel_for_tapered, whose chunks shrink so that the threads' last
// ones are short and both end an op at nearly the same time).
//
// Hand-off: a decode step is ~60 ops of tens of microseconds each, so waking a worker through a mutex and a
// condition variable (60-85 us per op on a VM) costs as much as the work. Workers and the caller
// instead wait on an atomic generation counter / done count: a short spin (spin_time(), when the machine
// has a free core), then std::atomic::wait (a futex), and an op makes no system call unless one of its
// threads sleeps (sleepers_). Between steps the workers fall asleep and cost nothing. The body is passed by
// reference (no std::function, no allocation per op).
// Thread-safety: one caller at a time (the engine thread owns the pool).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>
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

  // Calls fn(begin, end) on disjoint ranges covering [0, n) and returns when all are done. At most
  // min(size(), n / grain) threads take part (none but the caller when that is 1: no hand-off), and the
  // range is cut into up to kChunksPerThread chunks per such thread, each at least max(1, grain /
  // kChunksPerThread) long. The caller's thread claims chunks too.
  template <class Fn>
  void parallel_for(std::int64_t n, std::int64_t grain, Fn&& fn) {
    run(n, grain, 0, job_of(fn));
  }

  // The same, with chunks that shrink towards the end of the range (guided): each is 1 / (2 x threads) of
  // what is left, but at least `tail` long, so the threads' last chunks are short and neither waits long at
  // the end of the op for the other's (a memory-bound GEMV's equal quarters left one thread idle for up to
  // a quarter of its share). Same thread count as parallel_for; the boundaries depend only on n, grain,
  // tail and the pool size.
  template <class Fn>
  void parallel_for_tapered(std::int64_t n, std::int64_t grain, std::int64_t tail, Fn&& fn) {
    run(n, grain, std::max<std::int64_t>(1, tail), job_of(fn));
  }

  // Ops that went to the workers (parallel_for calls with more than one thread) since construction:
  // what the tests count per decode step.
  std::uint64_t handoffs() const { return generation_.load(std::memory_order_relaxed); }

  // How long a waiting thread spins on its own before std::atomic::wait (which itself spins a few
  // iterations and yields before its futex): KVFLEET_POOL_SPIN_US, read once (0: never spin). Unset, the
  // default is 100 us, but only while the machine has no more runnable threads than cores (/proc/stat,
  // checked every 20 ms): on the quiet 2-core VM that spin made batch-1 decode 1.5x faster, on the
  // oversubscribed one every spin lost (a spinning thread holds a core the thread it waits for needs).
  static std::chrono::microseconds spin_time();

  // Benchmarks only: notify on every op whether or not a thread sleeps, as before the sleeper counts (libstdc++
  // then decides whether that is a system call), to compare both in one process. Never changes a result.
  static void set_notify_always(bool on);

  static constexpr std::int64_t kChunksPerThread = 4;
  static constexpr std::int64_t kMaxChunks = 1024;  // chunks of one op at most (a tapered op's last chunk takes the rest)

 private:
  struct Job {
    void* fn;
    void (*call)(void*, std::int64_t, std::int64_t);
  };
  template <class Fn>
  static Job job_of(Fn& fn) {
    using F = std::remove_reference_t<Fn>;
    return {const_cast<void*>(static_cast<const void*>(std::addressof(fn))),
            [](void* f, std::int64_t b, std::int64_t e) { (*static_cast<F*>(f))(b, e); }};
  }
  // tail == 0: equal chunks (parallel_for); > 0: tapered ones (parallel_for_tapered). Returns the chunks.
  std::uint32_t cut(std::int64_t n, std::int64_t parts, std::int64_t grain, std::int64_t tail);
  void run(std::int64_t n, std::int64_t grain, std::int64_t tail, Job job);
  void run_chunks();  // claims and runs chunks of the current job until none is left
  void worker();

  std::vector<std::thread> workers_;
  Job job_{};
  std::int64_t bounds_[kMaxChunks + 1] = {};  // chunk c of the current job is [bounds_[c], bounds_[c + 1])
  // claim_: generation (high 32 bits) | chunks of the job (16) | next chunk to claim (16). A thread claims
  // chunk c by a compare-exchange from the word it read, so a late worker holding an old job's word can
  // never claim a chunk of the next job; job_ and bounds_ are written only while no chunk is claimed and undone.
  alignas(64) std::atomic<std::uint64_t> claim_{0};
  // generation_ wakes the workers (release: job_, bounds_ and claim_ are written before); done_ counts the
  // chunks finished, which the caller waits for.
  // 32 bits: std::atomic::wait is then a futex on the word itself (a 64-bit one waits through a shared proxy).
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  alignas(64) std::atomic<std::uint32_t> done_{0};
  std::atomic<bool> stop_{false};
  // Who sleeps in std::atomic::wait: workers on generation_ (sleepers_), the caller on done_ (caller_sleeps_);
  // an op notifies only then. libstdc++ counts waiters in a table of 16 slots shared by every atomic of the
  // process (GCC 12, bits/atomic_wait.h), and its notify makes a system call (a futex wake, 1-2 us on this
  // VM) whenever any thread waits on any atomic in the word's slot: measured (strace), two per op.
  alignas(64) std::atomic<std::uint32_t> sleepers_{0};
  std::atomic<bool> caller_sleeps_{false};
};

}  // namespace kvfleet
