// Per-sequence switch-off: a sequence whose drafts keep being rejected stops proposing for a while, so that
// verification rows that never pay stop costing forward time. Acceptance is an exponential moving average of
// (accepted / proposed) per verified step (weight kWeight). When it falls under kMinRate the sequence skips
// the next `backoff` decode steps (16, doubling on each further failure up to 256, back to 16 once the average
// climbs to kResetRate again), then tries again with the average reset to kResetRate.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvfleet::spec {

class AcceptanceTracker {
 public:
  static constexpr double kWeight = 0.3, kMinRate = 0.25, kResetRate = 0.5;
  static constexpr std::int32_t kFirstBackoff = 16, kMaxBackoff = 256;

  // Whether this decode step may propose; counts a skipped step down.
  bool may_propose() {
    if (skip_ == 0) return true;
    --skip_;
    return false;
  }
  void record(std::int32_t proposed, std::int32_t accepted) {
    if (proposed <= 0) return;
    rate_ = (1.0 - kWeight) * rate_ + kWeight * static_cast<double>(accepted) / proposed;
    if (rate_ < kMinRate) {
      skip_ = backoff_;
      backoff_ = std::min(backoff_ * 2, kMaxBackoff);
      rate_ = kResetRate;
    } else if (rate_ >= kResetRate) {  // doing well again: the next failure waits the first backoff only
      backoff_ = kFirstBackoff;
    }
  }
  double rate() const { return rate_; }

 private:
  double rate_ = kResetRate;
  std::int32_t skip_ = 0;
  std::int32_t backoff_ = kFirstBackoff;
};

}  // namespace kvfleet::spec
