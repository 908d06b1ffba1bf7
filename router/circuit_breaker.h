// CircuitBreaker: passive outlier ejection for one replica, from the outcomes of real requests
// (Envoy's consecutive-5xx outlier detection with a half-open probe phase).
//
//   closed    --(consecutive_failures failures in a row)-->             open
//   open      --(open_duration has passed, seen by available())-->       half_open
//   half_open --(half_open_probes probe requests all succeeded)-->       closed
//   half_open --(any probe failed)-->                                    open (the cool-down restarts)
//
// Knobs (router.yaml `circuit_breaker:`): consecutive_failures (0 turns the breaker off),
// open_ms (the cool-down), half_open_probes (requests let through at once while half-open, and the
// successes needed to close). What counts as a failure is the proxy's call: a refused or broken
// connection, a timeout, a 5xx answer. A success while closed resets the streak. Each request carries
// the Ticket on_dispatch() gave it, and only outcomes of requests sent in the current state count:
// a slow request sent before the circuit opened cannot close it, nor reopen it later.
//
// Threading: none of its own; the gateway calls it under its mutex.
#pragma once

#include <cstdint>
#include <string_view>

#include "router/prefix_tree.h"  // Tick

namespace kvfleet::router {

struct CircuitBreakerConfig {
  int consecutive_failures = 5;
  Tick open_duration = 10'000;  // in Tick units (the router: milliseconds)
  int half_open_probes = 1;
};

enum class CircuitState : std::uint8_t { closed = 0, open = 1, half_open = 2 };
std::string_view circuit_state_name(CircuitState s);

class CircuitBreaker {
 public:
  explicit CircuitBreaker(CircuitBreakerConfig config = {}) : config_(config) {}

  // Whether a request may be sent now. Moves open -> half_open once the cool-down passed; in
  // half_open, true while fewer than half_open_probes probes are in flight.
  bool available(Tick now);
  struct Ticket {
    std::uint64_t epoch = 0;  // which period of which state the request was sent in
  };
  // A request was sent (after available() said yes): in half_open it takes a probe slot.
  Ticket on_dispatch();
  void on_success(Ticket t);
  void on_failure(Ticket t, Tick now);
  // The request ended without a verdict (the client left): frees its probe slot, if it held one.
  void on_abandon(Ticket t);

  CircuitState state() const { return state_; }
  int failure_streak() const { return failures_; }

 private:
  void open(Tick now);
  void enter(CircuitState s);

  CircuitBreakerConfig config_;
  CircuitState state_ = CircuitState::closed;
  std::uint64_t epoch_ = 0;   // +1 on every state change
  int failures_ = 0;          // in a row, while closed
  Tick opened_at_ = 0;
  int probes_in_flight_ = 0;  // half_open only
  int probe_successes_ = 0;
};

}  // namespace kvfleet::router
