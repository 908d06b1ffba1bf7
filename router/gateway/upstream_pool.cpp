#include "router/gateway/upstream_pool.h"

#include <algorithm>

namespace kvfleet::router {

void UpstreamPool::take_expired(Clock::time_point now, std::vector<Idle>& out) {
  const auto fresh = std::find_if(idle_.begin(), idle_.end(), [&](const Idle& i) { return now - i.since < config_.idle_timeout; });
  std::move(idle_.begin(), fresh, std::back_inserter(out));
  idle_.erase(idle_.begin(), fresh);
}

std::unique_ptr<http::HttpClient> UpstreamPool::take(const boost::asio::any_io_executor& executor, Clock::time_point now) {
  std::vector<Idle> expired;
  std::unique_ptr<http::HttpClient> client;
  {
    std::lock_guard lock(mutex_);
    take_expired(now, expired);
    if (!idle_.empty()) {
      client = std::move(idle_.back().client);
      idle_.pop_back();
    }
  }
  if (client) client->rebind(executor);
  return client;  // `expired` closes its connections here, outside the lock
}

void UpstreamPool::give_back(std::unique_ptr<http::HttpClient> client, Clock::time_point now) {
  if (!client || !client->reusable()) return;
  std::vector<Idle> expired;
  std::lock_guard lock(mutex_);
  take_expired(now, expired);
  if (idle_.size() >= config_.max_idle) return;
  idle_.push_back(Idle{std::move(client), now});
}

void UpstreamPool::prune(Clock::time_point now) {
  std::vector<Idle> expired;
  std::lock_guard lock(mutex_);
  take_expired(now, expired);
}

void UpstreamPool::clear() {
  std::vector<Idle> all;
  std::lock_guard lock(mutex_);
  all.swap(idle_);
}

std::size_t UpstreamPool::idle() const {
  std::lock_guard lock(mutex_);
  return idle_.size();
}

}  // namespace kvfleet::router
