// The cost of one parallel_for hand-off and return in the kernels' ThreadPool (spin, then futex).
//
//   build/bin/bench_thread_pool [--threads 2] [--ops 20000] [--rounds 4]
//
// Each op is parallel_for(n = threads, grain 1) over a trivial body: what remains is the hand-off (a caller
// that finds the worker slow to start may run every chunk itself: it never waits for a thread with nothing
// claimed). Then ops with work: n = 4 x threads items of ~5 us each, reported as the time beyond the ideal
// split (items x 5 us / threads): hand-off plus the wait for the slowest. Both with the pool notifying on every
// op (ThreadPool::set_notify_always) against only a sleeping thread (the default), alternating.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"

using Clock = std::chrono::steady_clock;

namespace {

double us_per_op(kvfleet::ThreadPool& pool, int ops) {
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
double overhead_per_work_op(kvfleet::ThreadPool& pool, int ops) {
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
  kvfleet::ThreadPool pool(threads);
  std::printf("threads %u, %d ops per measurement\n", threads, ops);
  // Notifying on every op (as before the sleeper counts: libstdc++ makes that a futex system call whenever
  // any thread of the process waits on an atomic in the same slot of its waiter table) against only when
  // one of the pool's threads sleeps (the default), with another pool's workers asleep in the process, as
  // the engine's sampling pool sleeps beside its backend's.
  kvfleet::ThreadPool asleep(4);
  asleep.parallel_for(4, 1, [](std::int64_t, std::int64_t) {});
  double best_bare[2] = {1e30, 1e30}, best_work[2] = {1e30, 1e30};  // [1]: notifying on every op
  for (int r = 0; r < rounds; ++r) {
    for (const int always : {1, 0}) {
      kvfleet::ThreadPool::set_notify_always(always == 1);
      const double bare = us_per_op(pool, ops), work = overhead_per_work_op(pool, ops / 10);
      best_bare[always] = std::min(best_bare[always], bare);
      best_work[always] = std::min(best_work[always], work);
      std::printf("round %d, notifying %s: %8.2f us/op bare, %8.2f beyond the ideal with work\n", r,
                  always ? "on every op      " : "only a sleeper   ", bare, work);
    }
  }
  kvfleet::ThreadPool::set_notify_always(false);
  std::printf("best, notifying on every op / only a sleeper: bare %.2f / %.2f us/op, with work %.2f / %.2f us/op\n",
              best_bare[1], best_bare[0], best_work[1], best_work[0]);
  return 0;
}
