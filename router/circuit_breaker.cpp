#include "router/circuit_breaker.h"

namespace kvfleet::router {

std::string_view circuit_state_name(CircuitState s) {
  switch (s) {
    case CircuitState::closed: return "closed";
    case CircuitState::open: return "open";
    case CircuitState::half_open: return "half_open";
  }
  return "?";
}

bool CircuitBreaker::available(Tick now) {
  if (state_ == CircuitState::open && now >= opened_at_ + config_.open_duration) enter(CircuitState::half_open);
  switch (state_) {
    case CircuitState::closed: return true;
    case CircuitState::open: return false;
    case CircuitState::half_open: return probes_in_flight_ < config_.half_open_probes;
  }
  return false;
}

CircuitBreaker::Ticket CircuitBreaker::on_dispatch() {
  if (state_ == CircuitState::half_open) ++probes_in_flight_;
  return Ticket{epoch_};
}

void CircuitBreaker::on_success(Ticket t) {
  if (t.epoch != epoch_) return;
  if (state_ == CircuitState::closed) {
    failures_ = 0;
  } else if (state_ == CircuitState::half_open) {
    --probes_in_flight_;
    if (++probe_successes_ >= config_.half_open_probes) enter(CircuitState::closed);
  }
}

void CircuitBreaker::on_failure(Ticket t, Tick now) {
  if (t.epoch != epoch_ || config_.consecutive_failures <= 0) return;
  if (state_ == CircuitState::closed) {
    if (++failures_ >= config_.consecutive_failures) open(now);
  } else if (state_ == CircuitState::half_open) {
    open(now);
  }
}

void CircuitBreaker::on_abandon(Ticket t) {
  if (t.epoch == epoch_ && state_ == CircuitState::half_open) --probes_in_flight_;
}

void CircuitBreaker::open(Tick now) {
  enter(CircuitState::open);
  opened_at_ = now;
}

void CircuitBreaker::enter(CircuitState s) {
  state_ = s;
  ++epoch_;
  failures_ = 0;
  probes_in_flight_ = 0;
  probe_successes_ = 0;
}

}  // namespace kvfleet::router
