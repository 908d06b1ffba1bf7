#include "kvfleet/http/shutdown.h"

#include <pthread.h>

#include <cstdio>

namespace kvfleet::http {

sigset_t block_shutdown_signals(std::initializer_list<int> extra) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  for (const int s : extra) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

void wait_then_drain(const char* program, const sigset_t& signals, const std::function<bool()>& drain,
                     const std::function<void(int)>& on_other) {
  int sig = 0;
  // sigwait fails only on a bad set: then stop rather than spin.
  while (sigwait(&signals, &sig) == 0 && sig != SIGTERM && sig != SIGINT)
    if (on_other) on_other(sig);
  std::fprintf(stderr, "%s: %s, draining\n", program, sig == SIGTERM ? "SIGTERM" : "SIGINT");
  const bool clean = drain();
  std::fprintf(stderr, "%s: %s\n", program, clean ? "drained" : "drain timed out; stopped");
}

}  // namespace kvfleet::http
