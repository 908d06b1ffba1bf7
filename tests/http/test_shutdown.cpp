// block_shutdown_signals and wait_then_drain, on signals sent to this thread only.
#include <doctest/doctest.h>

#include <pthread.h>

#include <vector>

#include "kvfleet/http/shutdown.h"

using namespace kvfleet::http;

TEST_CASE("wait_then_drain: another signal goes to on_other, then SIGTERM drains once") {
  sigset_t before;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  const sigset_t signals = block_shutdown_signals({SIGHUP});
  // Both pending before the wait: sigwait takes the lower number (SIGHUP) first.
  pthread_kill(pthread_self(), SIGHUP);
  pthread_kill(pthread_self(), SIGTERM);
  std::vector<int> others;
  int drains = 0;
  wait_then_drain("test_shutdown", signals, [&] { return ++drains > 0; }, [&](int s) { others.push_back(s); });
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  CHECK(others == std::vector<int>{SIGHUP});
  CHECK(drains == 1);
}

TEST_CASE("wait_then_drain: SIGINT drains too, with no handler for other signals") {
  sigset_t before;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  const sigset_t signals = block_shutdown_signals();
  CHECK(sigismember(&signals, SIGTERM) == 1);
  CHECK(sigismember(&signals, SIGHUP) == 0);
  pthread_kill(pthread_self(), SIGINT);
  int drains = 0;
  wait_then_drain("test_shutdown", signals, [&] { return ++drains > 0; });
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  CHECK(drains == 1);
}
