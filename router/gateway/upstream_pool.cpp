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
    // Only a connection already on this executor (the strand of the client connection that used it
    // last: a keep-alive client's next request). Moving one to another strand (releasing the
    // descriptor into a new socket object) left some upstream operations never completing under load; see router/README.md.
    for (auto it = idle_.rbegin(); it != idle_.rend(); ++it) {
      if (it->client->executor() == executor) {
        client = std::move(it->client);
        idle_.erase(std::next(it).base());
        break;
      }
    }
  }
  return client;  // `expired` closes its connections here, outside the lock
}

void UpstreamPool::give_back(std::unique_ptr<http::HttpClient> client, Clock::time_point now) {
  if (!client || !client->reusable()) return;
  std::vector<Idle> expired;
  std::lock_guard lock(mutex_);
  take_expired(now, expired);
  if (config_.max_idle == 0) return;
  if (idle_.size() >= config_.max_idle) {  // full: the oldest goes (its client connection may be gone)
    expired.push_back(std::move(idle_.front()));
    idle_.erase(idle_.begin());
  }
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
