#include "router/gateway/response_owners.h"

namespace kvfleet::router {

void ResponseOwners::remember(const std::string& id, const std::string& replica_url) {
  if (max_entries_ == 0) return;
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    it->second.url = replica_url;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return;
  }
  while (entries_.size() >= max_entries_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(id);
  entries_.emplace(id, Entry{replica_url, lru_.begin()});
}

std::optional<std::string> ResponseOwners::find(std::string_view id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(std::string(id));
  if (it == entries_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.url;
}

void ResponseOwners::forget(std::string_view id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(std::string(id));
  if (it == entries_.end()) return;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void ResponseOwners::forget_replica(std::string_view replica_url) {
  std::lock_guard lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.url == replica_url) {
      lru_.erase(it->second.lru);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

std::size_t ResponseOwners::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace kvfleet::router
