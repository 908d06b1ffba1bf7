#include "kvfleet/kv_events.h"

#include <unistd.h>

#include <random>
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

namespace {

std::uint64_t new_instance_id() {
  std::random_device device;
  const auto now = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  std::uint64_t id = (std::uint64_t{device()} << 32 | device()) ^ now ^ (std::uint64_t(::getpid()) << 48);
  return id == 0 ? 1 : id;
}

}  // namespace

KvEventRing::KvEventRing(std::size_t capacity, std::int32_t block_size, BlockHash root)
    : capacity_(capacity), block_size_(block_size), root_(root), instance_(new_instance_id()) {
  if (capacity == 0) throw std::invalid_argument("KvEventRing: capacity must be positive");
}

std::uint64_t KvEventRing::publish(KvEvent::Type type, std::vector<BlockHash> block_hashes, BlockHash parent,
                                   std::int32_t dp_rank, KvMedium medium) {
  std::uint64_t seq = 0;
  std::vector<std::shared_ptr<Listener>> notify;
  {
    std::lock_guard lock(mu_);
    seq = ++last_seq_;
    if (ring_.size() == capacity_) ring_.pop_front();
    ring_.push_back(KvEvent{seq, type, std::move(block_hashes), parent, dp_rank, medium});
    for (auto it = listeners_.begin(); it != listeners_.end();) {
      if (auto l = it->lock()) {
        notify.push_back(std::move(l));
        ++it;
      } else {
        it = listeners_.erase(it);
      }
    }
  }
  for (const auto& l : notify) (*l)();
  return seq;
}

std::shared_ptr<void> KvEventRing::subscribe(Listener notify) const {
  auto handle = std::make_shared<Listener>(std::move(notify));
  std::lock_guard lock(mu_);
  listeners_.push_back(handle);
  return handle;
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

}  // namespace kvfleet
