// How the servers (kvfleet-replica, kvfleet-router) stop: SIGTERM or SIGINT drains (new requests get 503
// while running ones finish, as each server's drain() decides), then the process exits.
//
// The signals are blocked before any thread starts (threads inherit the mask) and taken with sigwait on
// the main thread: no signal handler ever interrupts an io thread or the engine loop, and whatever runs
// on a signal may lock and allocate freely.
#pragma once

#include <csignal>
#include <functional>
#include <initializer_list>

namespace kvfleet::http {

// Blocks SIGTERM, SIGINT and `extra` (the router's SIGHUP) in this thread and every thread it starts
// afterwards: call it first in main. Returns the blocked set, for wait_then_drain.
sigset_t block_shutdown_signals(std::initializer_list<int> extra = {});

// Waits for SIGTERM or SIGINT, then runs drain() (true: every request finished in time), logging
// "PROGRAM: SIGTERM, draining" and "PROGRAM: drained" (or "drain timed out; stopped") to stderr. Any
// other signal of `signals` goes to on_other and the wait goes on.
void wait_then_drain(const char* program, const sigset_t& signals, const std::function<bool()>& drain,
                     const std::function<void(int)>& on_other = {});

}  // namespace kvfleet::http
