#include "router/gateway/upstream_pool.h"

#include <algorithm>

namespace kvfleet::router {

namespace {
constexpr std::ptrdiff_t kExecutorSearch = 8;  // newest idle connections looked at for a same-executor one
}  // namespace

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
    // Newest first, but one already on this executor (the strand of the client connection that
    // used it last: a keep-alive client's next request) needs no re-registration.
    auto chosen = idle_.rbegin();
    for (auto it = idle_.rbegin(); it != idle_.rend() && it - idle_.rbegin() < kExecutorSearch; ++it) {
      if (it->client->executor() == executor) {
        chosen = it;
        break;
      }
    }
    if (chosen != idle_.rend()) {
      client = std::move(chosen->client);
      idle_.erase(std::next(chosen).base());
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
