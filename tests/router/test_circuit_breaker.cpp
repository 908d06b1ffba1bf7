// CircuitBreaker: every transition, with exact counts and times.
#include <doctest/doctest.h>

#include "router/circuit_breaker.h"

namespace kvfleet::router {

namespace {

CircuitBreaker make_breaker(int failures = 3, Tick open_ms = 1000, int probes = 2) {
  CircuitBreakerConfig c;
  c.consecutive_failures = failures;
  c.open_duration = open_ms;
  c.half_open_probes = probes;
  return CircuitBreaker(c);
}

// Sends one request and reports it failed at `now`.
void fail_one(CircuitBreaker& b, Tick now) { b.on_failure(b.on_dispatch(), now); }

}  // namespace

TEST_CASE("closed -> open after exactly consecutive_failures failures in a row; a success resets the streak") {
  CircuitBreaker b = make_breaker(3);
  fail_one(b, 10);
  fail_one(b, 11);
  CHECK(b.failure_streak() == 2);
  b.on_success(b.on_dispatch());
  CHECK(b.failure_streak() == 0);
  fail_one(b, 12);
  fail_one(b, 13);
  CHECK(b.state() == CircuitState::closed);
  CHECK(b.available(13));
  fail_one(b, 14);
  CHECK(b.state() == CircuitState::open);
  CHECK_FALSE(b.available(14));
  CHECK_FALSE(b.available(1013));  // opened at 14, cool-down 1000
}

TEST_CASE("open -> half_open after the cool-down; probes limited; all probes succeed -> closed") {
  CircuitBreaker b = make_breaker(1, 1000, 2);
  fail_one(b, 100);
  REQUIRE(b.state() == CircuitState::open);
  CHECK(b.available(1100));
  CHECK(b.state() == CircuitState::half_open);
  const auto p1 = b.on_dispatch();
  CHECK(b.available(1101));
  const auto p2 = b.on_dispatch();
  CHECK_FALSE(b.available(1102));  // two probes in flight
  b.on_success(p1);
  CHECK(b.state() == CircuitState::half_open);
  CHECK(b.available(1103));        // p1's slot is free again
  b.on_success(p2);
  CHECK(b.state() == CircuitState::closed);
  CHECK(b.available(1104));
}

TEST_CASE("half_open -> open on a failed probe; the cool-down restarts from that failure") {
  CircuitBreaker b = make_breaker(1, 1000, 1);
  fail_one(b, 0);
  REQUIRE(b.available(1000));
  const auto probe = b.on_dispatch();
  b.on_failure(probe, 1500);
  CHECK(b.state() == CircuitState::open);
  CHECK_FALSE(b.available(2499));
  CHECK(b.available(2500));
  CHECK(b.state() == CircuitState::half_open);
}

TEST_CASE("outcomes of requests sent before a state change do not count") {
  CircuitBreaker b = make_breaker(2, 1000, 1);
  const auto slow = b.on_dispatch();  // sent while closed, answers much later
  fail_one(b, 0);
  fail_one(b, 1);
  REQUIRE(b.state() == CircuitState::open);
  b.on_success(slow);  // must not close an open circuit
  CHECK(b.state() == CircuitState::open);
  REQUIRE(b.available(1001));
  b.on_failure(slow, 1002);  // nor reopen a half-open one
  CHECK(b.state() == CircuitState::half_open);
  const auto probe = b.on_dispatch();
  b.on_abandon(probe);  // the client left: the slot frees without a verdict
  CHECK(b.state() == CircuitState::half_open);
  CHECK(b.available(1003));
  b.on_success(b.on_dispatch());
  CHECK(b.state() == CircuitState::closed);
}

TEST_CASE("consecutive_failures 0 turns the breaker off") {
  CircuitBreaker b = make_breaker(0);
  for (Tick t = 0; t < 100; ++t) fail_one(b, t);
  CHECK(b.state() == CircuitState::closed);
  CHECK(b.available(100));
}

TEST_CASE("circuit state names") {
  CHECK(circuit_state_name(CircuitState::closed) == "closed");
  CHECK(circuit_state_name(CircuitState::open) == "open");
  CHECK(circuit_state_name(CircuitState::half_open) == "half_open");
}

}  // namespace kvfleet::router
