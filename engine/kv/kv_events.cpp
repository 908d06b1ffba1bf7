#include "kvfleet/kv_events.h"

#include <stdexcept>

namespace kvfleet {

const char* to_string(KvEvent::Type type) {
  switch (type) {
    case KvEvent::Type::stored: return "stored";
    case KvEvent::Type::removed: return "removed";
    case KvEvent::Type::cleared: return "cleared";
  }
  return "unknown";
}

KvEventRing::KvEventRing(std::size_t capacity, std::int32_t block_size, BlockHash root)
    : capacity_(capacity), block_size_(block_size), root_(root) {
  if (capacity == 0) throw std::invalid_argument("KvEventRing: capacity must be positive");
}

std::uint64_t KvEventRing::publish(KvEvent::Type type, std::vector<BlockHash> block_hashes, BlockHash parent) {
  std::uint64_t seq = 0;
  {
    std::lock_guard lock(mu_);
    seq = ++last_seq_;
    if (ring_.size() == capacity_) ring_.pop_front();
    ring_.push_back(KvEvent{seq, type, std::move(block_hashes), parent});
  }
  cv_.notify_all();
  return seq;
}

std::uint64_t KvEventRing::last_seq() const {
  std::lock_guard lock(mu_);
  return last_seq_;
}

KvReplay KvEventRing::since(std::uint64_t seq) const {
  std::lock_guard lock(mu_);
  KvReplay out;
  out.last_seq = last_seq_;
  const std::uint64_t oldest = ring_.empty() ? last_seq_ + 1 : ring_.front().seq;
  // Replaying needs every event from seq + 1 on: the oldest kept one must be no later than that.
  if (seq > last_seq_ || seq + 1 < oldest) {
    out.fell_behind = true;
    return out;
  }
  out.events.assign(ring_.begin() + static_cast<std::ptrdiff_t>(seq + 1 - oldest), ring_.end());
  return out;
}

std::uint64_t KvEventRing::wait_newer(std::uint64_t seq, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return last_seq_ > seq; });
  return last_seq_;
}

}  // namespace kvfleet
