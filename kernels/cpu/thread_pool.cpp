#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvfleet {
namespace {

using Clock = std::chrono::steady_clock;

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

// Whether spinning pays now, and whether a long spin should yield. With KVFLEET_POOL_SPIN_US set: always
// spin (the user chose), and yield. Otherwise spin only while no more threads want to run than there are
// cores, plus one: the count includes this reading thread and often a transient kernel thread. A spinning
// thread on an oversubscribed machine holds a core that the thread it waits for needs (measured: on the
// loaded 2-core VM every spin lost; on the quiet one a 100 us spin made batch-1 decode 1.5x faster).
// Re-checked every 20 ms by whichever thread comes first.
// Yield: past the first few microseconds, a spin lets another runnable thread have its core (maybe the one
// awaited, or a thread of the program that calls the engine: with one runnable thread more than cores, a
// spin that never yields held back a test's main thread long enough for a request it was about to abort
// to finish, 1 run in 60 under load). With no more runnable threads than cores nobody waits for the core,
// and a yield is only a system call (1-2 us on the Zen 5 VM, with PTI) that the wake-up may have to wait
// out: sched_yield + futex were ~3% of a 125M batch-1 decode's samples at 2 threads, so then it does not.
struct SpinPolicy {
  bool spin = false, yield = true;
};

SpinPolicy spin_policy() {
  static const bool forced = [] {
    const char* env = std::getenv("KVFLEET_POOL_SPIN_US");
    return env && *env;
  }();
  if (forced) return {true, true};
  static const long cores = std::max(1u, std::thread::hardware_concurrency());
  static std::atomic<std::int64_t> next_check{0};
  static std::atomic<int> state{0};  // 0: no spin; 1: spin and yield; 2: spin without yielding
  const std::int64_t now = Clock::now().time_since_epoch().count();
  std::int64_t due = next_check.load(std::memory_order_relaxed);
  if (now >= due && next_check.compare_exchange_strong(due, now + 20'000'000, std::memory_order_relaxed)) {
    const long running = procs_running();
    state.store(running <= 0 || running > cores + 1 ? 0 : running > cores ? 1 : 2, std::memory_order_relaxed);
  }
  const int st = state.load(std::memory_order_relaxed);
  return {st > 0, st < 2};
}

// Spins until pred() holds or spin_time() has passed; true if pred() held. The clock is read every 64
// pauses only.
template <class Pred>
bool spin_until(Pred pred) {
  static const auto spin = ThreadPool::spin_time();
  const SpinPolicy policy = spin.count() > 0 ? spin_policy() : SpinPolicy{};
  if (!policy.spin) return pred();
  const auto deadline = Clock::now() + spin;
  for (unsigned i = 1;; ++i) {
    if (pred()) return true;
    _mm_pause();
    if (i % 64 == 0) {
      if (Clock::now() > deadline) return pred();
      if (policy.yield && i >= 1024) std::this_thread::yield();
    }
  }
}

std::atomic<bool> g_notify_always{false};

}  // namespace

void ThreadPool::set_notify_always(bool on) { g_notify_always.store(on, std::memory_order_relaxed); }

std::chrono::microseconds ThreadPool::spin_time() {
  static const std::chrono::microseconds us = [] {
    const char* env = std::getenv("KVFLEET_POOL_SPIN_US");
    return std::chrono::microseconds(env && *env ? std::strtol(env, nullptr, 10) : 100);
  }();
  return us;
}

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

std::uint32_t ThreadPool::cut(std::int64_t n, std::int64_t parts, std::int64_t grain, std::int64_t tail) {
  std::int64_t c = 0;
  if (tail == 0) {  // equal chunks: up to kChunksPerThread per thread, each at least grain / kChunksPerThread
    const std::int64_t min_chunk = std::max<std::int64_t>(1, grain / kChunksPerThread);
    const std::int64_t want = std::clamp<std::int64_t>(n / min_chunk, parts, std::min(parts * kChunksPerThread, kMaxChunks));
    const std::int64_t chunk = (n + want - 1) / want;
    for (std::int64_t b = 0; b < n; b += chunk) bounds_[c++] = b;
  } else {  // tapered: 1 / (2 parts) of the rest, at least tail; the last chunk takes what the cap leaves
    for (std::int64_t b = 0; b < n && c < kMaxChunks; ++c) {
      bounds_[c] = b;
      b += std::max(tail, (n - b) / (2 * parts));
    }
  }
  bounds_[c] = n;
  return static_cast<std::uint32_t>(c);
}

void ThreadPool::run(std::int64_t n, std::int64_t grain, std::int64_t tail, Job job) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(1, grain);
  const auto parts = std::min<std::int64_t>(size(), std::max<std::int64_t>(1, n / grain));
  if (parts <= 1) {
    job.call(job.fn, 0, n);
    return;
  }
  job_ = job;
  const std::uint64_t chunks = cut(n, parts, grain, tail);
  const std::uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  done_.store(0, std::memory_order_relaxed);
  claim_.store((std::uint64_t{gen} << 32) | (chunks << 16), std::memory_order_release);
  // Publishes job_, bounds_, done_ and claim_. seq_cst, as the load of sleepers_ after it and a sleeping
  // worker's count and check (worker()): either this load sees the sleeper, or the sleeper sees this op.
  generation_.store(gen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0 || g_notify_always.load(std::memory_order_relaxed))
    generation_.notify_all();
  run_chunks();
  const auto all = static_cast<std::uint32_t>(chunks);
  if (!spin_until([&] { return done_.load(std::memory_order_acquire) == all; })) {
    caller_sleeps_.store(true, std::memory_order_seq_cst);  // then whoever ends the last chunk wakes it
    for (std::uint32_t d; (d = done_.load(std::memory_order_seq_cst)) != all;) done_.wait(d, std::memory_order_acquire);
    caller_sleeps_.store(false, std::memory_order_relaxed);
  }
}

void ThreadPool::run_chunks() {
  std::uint64_t v = claim_.load(std::memory_order_acquire);
  for (;;) {
    const auto chunks = static_cast<std::uint32_t>((v >> 16) & 0xffff), next = static_cast<std::uint32_t>(v & 0xffff);
    if (next >= chunks) return;
    // On failure v is the word now: another chunk was claimed, or (a late worker) another job began.
    if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    job_.call(job_.fn, bounds_[next], bounds_[next + 1]);
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == chunks &&
        (caller_sleeps_.load(std::memory_order_seq_cst) || g_notify_always.load(std::memory_order_relaxed)))
      done_.notify_one();
    ++v;  // most often the word as it is now; if not, the exchange fails and reloads it
  }
}

void ThreadPool::worker() {
  std::uint32_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);  // then run() wakes it (see there)
      if (generation_.load(std::memory_order_seq_cst) == seen) generation_.wait(seen, std::memory_order_acquire);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      continue;  // woken (or spuriously): check again, spinning first
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_relaxed)) return;
    run_chunks();
  }
}

}  // namespace kvfleet
