// Flow control: whose request it is (tenant), how urgent (priority), and the waiting room that hands out
// forwarding slots by band and by fair share (router/flow/fair_queue.h).
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <limits>

#include "kvfleet/secure_compare.h"
#include "router/gateway/gateway.h"
#include "router/gateway/relay_util.h"

namespace kvfleet::router {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

constexpr std::size_t kMaxTenantName = 64;
constexpr std::size_t kMaxTenantSeries = 64;  // tenants with their own metric series; the rest count as "other"

bool tenant_name_ok(std::string_view s) {
  if (s.empty() || s.size() > kMaxTenantName) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

// vLLM's `priority` is an int; the band keys are int64 but a value past int32 is refused like vLLM's.
bool priority_in_range(std::int64_t p) {
  return p >= std::numeric_limits<std::int32_t>::min() && p <= std::numeric_limits<std::int32_t>::max();
}

std::optional<std::string_view> bearer_token(const http::Request& req) {
  const std::string* h = req.headers.find("Authorization");
  constexpr std::string_view prefix = "Bearer ";
  if (!h || h->size() < prefix.size() || std::string_view(*h).substr(0, prefix.size()) != prefix) return std::nullopt;
  return std::string_view(*h).substr(prefix.size());
}

}  // namespace

std::optional<std::pair<std::string, std::string>> Gateway::flow_of(const http::Request& req, const json::object& body,
                                                                    FlowKey& key) const {
  bool keyed = false;
  {
    std::lock_guard lock(mutex_);
    if (!api_keys_.empty()) {
      // authorized() let the request in, so one key matches; each is compared in full (no early exit).
      std::size_t which = 0;
      if (const auto token = bearer_token(req))
        for (std::size_t i = 0; i < api_keys_.size(); ++i)
          if (secure_equal(*token, api_keys_[i]) && which == 0) which = i + 1;
      keyed = which > 0;
      if (keyed) key.tenant = "key-" + std::to_string(which);
    }
  }
  if (!keyed)
    if (const std::string* t = req.headers.find("x-kvfleet-tenant")) {
      if (!tenant_name_ok(*t))
        return std::pair{"the x-kvfleet-tenant header must be 1-64 characters of letters, digits, '-', '_' or '.'",
                         std::string("x-kvfleet-tenant")};
      key.tenant = *t;
    }
  if (const json::value* p = body.if_contains("priority"); p && !p->is_null()) {
    if (!p->is_int64() || !priority_in_range(p->as_int64()))
      return std::pair{"'priority' must be a 32-bit integer (lower is served first)", std::string("priority")};
    key.priority = p->as_int64();
  } else if (const std::string* h = req.headers.find("x-kvfleet-priority")) {
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(h->data(), h->data() + h->size(), v);
    if (ec != std::errc() || end != h->data() + h->size() || !priority_in_range(v))
      return std::pair{"the x-kvfleet-priority header must be a 32-bit integer (lower is served first)",
                       std::string("x-kvfleet-priority")};
    key.priority = v;
  }
  return std::nullopt;
}

double Gateway::active_weight_locked(double now) {
  const double idle = std::chrono::duration<double>(config_.tenant_idle).count();
  double sum = 0;
  for (auto it = tenant_flows_.begin(); it != tenant_flows_.end();) {
    const bool active = it->second.in_flight > 0 || waiting_room_.waiting(it->first) > 0 || now - it->second.last_seen < idle;
    if (!active) {
      it = tenant_flows_.erase(it);
      continue;
    }
    sum += waiting_room_.weight(it->first);
    ++it;
  }
  return sum;
}

std::size_t Gateway::slot_share_locked(const std::string& tenant, double active_weight) const {
  const double share = static_cast<double>(config_.max_concurrency) * waiting_room_.weight(tenant) / active_weight;
  return std::max<std::size_t>(1, static_cast<std::size_t>(share));
}

// A free slot at once, or a place in the waiting room until release_slot() hands one over, queue_timeout
// passes, a newcomer within its tenant's share takes the place, or the client leaves (its place is freed
// then, not when a slot or the timeout comes). A slot is free for a tenant while fewer than max_concurrency
// are taken and the tenant holds less than its share of them: a flooding tenant cannot take the slots a
// tenant active a moment ago will want. False: no slot (answer 429, unless the client is gone).
awaitable<bool> Gateway::admit(http::ResponseWriter& w, const FlowKey& flow) {
  auto waiter = std::make_shared<SlotWaiter>(co_await asio::this_coro::executor);
  waiter->timer.expires_after(config_.queue_timeout);
  std::shared_ptr<SlotWaiter> evicted;
  {
    std::lock_guard lock(mutex_);
    const double now = seconds_now();
    TenantFlow& mine = tenant_flows_[flow.tenant];
    mine.last_seen = now;
    if (active_ < config_.max_concurrency && waiting_room_.waiting(flow.tenant) == 0 &&
        mine.in_flight < slot_share_locked(flow.tenant, active_weight_locked(now))) {
      ++active_;
      ++tenant_flows_[flow.tenant].in_flight;  // (active_weight_locked keeps the entry: it was just seen)
      waiting_room_.charge(flow.tenant, flow.priority);
      co_return true;
    }
    if (w.client_gone()) co_return false;
    auto pushed = waiting_room_.push(flow.tenant, flow.priority, waiter);
    if (!pushed.admitted) co_return false;
    if (pushed.evicted) {
      evicted = std::move(*pushed.evicted);
      evicted->evicted = true;
    }
  }
  if (evicted) asio::post(evicted->timer.get_executor(), [evicted] { evicted->timer.cancel(); });
  const double queued_at = seconds_now();
  // The callback runs on the connection's strand, as this coroutine does, so a disconnect cannot come
  // between the client_gone() check above and the start of the wait: it always finds the wait to cancel.
  w.on_disconnect([waiter] { waiter->timer.cancel(); });
  boost::system::error_code ec;
  co_await waiter->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  w.on_disconnect([] {});
  bool granted = false;
  {
    std::lock_guard lock(mutex_);
    granted = waiter->granted;
    // Timed out, or the client left, before a slot came (an evicted waiter is out already).
    if (!granted && !waiter->evicted) waiting_room_.erase(flow.tenant, flow.priority, waiter);
  }
  if (granted)
    metrics_
        .histogram("kvfleet_router_tenant_queue_seconds", "Time a request waited for a forwarding slot, by tenant",
                   latency_buckets(), {{"tenant", tenant_label(flow.tenant)}})
        .Observe(seconds_now() - queued_at);
  co_return granted;
}

// The freed slot (and any other free one) goes straight to the waiters the waiting room serves next among
// the tenants under their share, so a burst cannot overtake the queue.
void Gateway::release_slot(const std::string& tenant) {
  std::vector<std::shared_ptr<SlotWaiter>> granted;
  {
    std::lock_guard lock(mutex_);
    --active_;
    const double now = seconds_now();
    if (auto it = tenant_flows_.find(tenant); it != tenant_flows_.end() && it->second.in_flight > 0) {
      --it->second.in_flight;
      it->second.last_seen = now;
    }
    const double weights = active_weight_locked(now);
    while (active_ < config_.max_concurrency) {
      auto next = waiting_room_.pop([&](const std::string& t) {
        auto it = tenant_flows_.find(t);
        return it == tenant_flows_.end() || it->second.in_flight < slot_share_locked(t, weights);
      });
      if (!next) break;
      ++active_;
      TenantFlow& flow = tenant_flows_[next->first];
      ++flow.in_flight;
      flow.last_seen = now;
      next->second->granted = true;
      granted.push_back(std::move(next->second));
      const double tau = 5.0;
      grant_rate_ = grant_rate_ * std::exp(-(now - last_grant_) / tau) + 1.0 / tau;
      last_grant_ = now;
    }
  }
  for (auto& next : granted) asio::post(next->timer.get_executor(), [next] { next->timer.cancel(); });
}

// How long until the tenant's waiters ahead have been served, at the recent rate of grants.
int Gateway::retry_after_seconds(const std::string& tenant) {
  std::lock_guard lock(mutex_);
  const double rate = grant_rate_ * std::exp(-(seconds_now() - last_grant_) / 5.0);
  const double ahead = static_cast<double>(waiting_room_.waiting(tenant) + 1);
  const double fallback = std::chrono::duration<double>(config_.queue_timeout).count();
  const double s = rate > 1e-3 ? ahead / rate : fallback;
  return static_cast<int>(std::clamp(std::ceil(s), 1.0, 60.0));
}

std::string Gateway::tenant_label(const std::string& tenant) {
  std::lock_guard lock(series_mutex_);
  if (tenant_labels_.count(tenant)) return tenant;
  if (tenant_labels_.size() >= kMaxTenantSeries) return "other";
  tenant_labels_.insert(tenant);
  return tenant;
}

void Gateway::count_tenant(const std::string& tenant, const char* outcome) {
  metrics_
      .counter("kvfleet_router_tenant_requests_total", "Requests by tenant, admitted to a replica or refused with 429",
               {{"tenant", tenant_label(tenant)}, {"outcome", outcome}})
      .Increment();
}

}  // namespace kvfleet::router
