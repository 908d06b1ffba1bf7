// The admin API (/admin/*) and the API key checks: who may call what, and the replica list's
// handlers (list, add, remove, drain), including the cleanup of a removed replica's metric series.
#include <algorithm>
#include <boost/json.hpp>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>

#include "kvfleet/http/json_error.h"
#include "kvfleet/secure_compare.h"
#include "router/gateway/gateway.h"

namespace kvfleet::router {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The url given as ?url=... (percent-decoded: clients commonly encode ':' and '/') or as {"url": ...}
// in the body; "" when neither. Throws std::invalid_argument on a bad percent-escape.
std::string url_param(const http::Request& req) {
  if (auto q = req.query_param("url")) {
    std::string out;
    for (std::size_t i = 0; i < q->size(); ++i) {
      if ((*q)[i] != '%') {
        out.push_back((*q)[i]);
        continue;
      }
      const bool whole = i + 2 < q->size();
      const int hi = whole ? hex_digit((*q)[i + 1]) : -1;
      const int lo = whole ? hex_digit((*q)[i + 2]) : -1;
      if (hi < 0 || lo < 0) throw std::invalid_argument("'url' has a bad percent-escape");
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    }
    return out;
  }
  json::error_code ec;
  const json::value body = json::parse(req.body, ec);
  if (!ec && body.is_object())
    if (const auto* u = body.as_object().if_contains("url"); u && u->is_string()) return std::string(u->as_string());
  return {};
}


// The ranks of an expert-parallel replica as its targets (empty: it is one target).
json::array ranks_json(const ReplicaLink& l) {
  json::array out;
  for (std::size_t k = 0; k < l.ranks.size(); ++k) {
    const RankTarget& t = l.ranks[k];
    json::value load = nullptr;
    if (t.load_reported)
      load = json::object{{"waiting", t.reported_waiting}, {"running", t.reported_running}, {"kv_usage", t.reported_kv_usage}};
    out.push_back(json::object{{"dp_rank", k},
                               {"slot", t.slot},
                               {"in_flight_requests", t.in_flight},
                               {"routed", t.routed},
                               {"reported_load", load}});
  }
  return out;
}

}  // namespace

// Admin: its own key; a bad ?url= escape is the client's error (400), not ours.
awaitable<void> Gateway::admin_guard(AdminHandler method, const http::Request& req, http::ResponseWriter& w) {
  int status = 0;
  std::string why;
  if (!admin_authorized(req, status, why)) {
    co_await w.send(http::json_error(status, why, "authentication_error", "", "invalid_api_key"));
    co_return;
  }
  std::string bad_url;
  try {
    if (req.query_param("url")) url_param(req);
  } catch (const std::invalid_argument& e) {
    bad_url = e.what();
  }
  if (!bad_url.empty()) {
    co_await w.send(http::json_error(400, bad_url, "invalid_request_error", "url"));
    co_return;
  }
  co_await (this->*method)(req, w);
}

awaitable<void> Gateway::list_replicas(const http::Request&, http::ResponseWriter& w) {
  json::array list;
  json::object tree;
  std::size_t active = 0, queued = 0;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_) {
      json::value load = nullptr;  // the replica's own report, when its stream carries one
      if (l->load_reported)
        load = json::object{{"waiting", l->reported_waiting}, {"running", l->reported_running},
                            {"kv_usage", l->reported_kv_usage}};
      list.push_back(json::object{{"url", l->url},
                                  {"discovered", l->discovered},
                                  {"reported_load", load},
                                  {"slot", l->slot},
                                  {"healthy", l->healthy},
                                  {"draining", l->draining},
                                  {"circuit_breaker", circuit_state_name(l->breaker.state())},
                                  {"failure_streak", l->breaker.failure_streak()},
                                  {"idle_connections", l->pool.idle()},
                                  {"mode", index_.mode(l->slot) == CacheMode::exact ? "exact" : "approximate"},
                                  {"mode_reason", index_.mode_reason(l->slot)},
                                  {"last_seq", index_.last_seq(l->slot)},
                                  {"events_applied", l->events_applied},
                                  {"orphans_dropped", index_.orphans_dropped(l->slot)},
                                  {"snapshots", index_.snapshots(l->slot)},
                                  {"shared_tier", index_.tiers().shared_id(l->slot)},
                                  {"tier_blocks", json::object{{"host", index_.tiers().count(l->slot, Medium::host)},
                                                               {"disk", index_.tiers().count(l->slot, Medium::disk)},
                                                               {"shared", index_.tiers().count(l->slot, Medium::shared)}}},
                                  {"in_flight_requests", l->in_flight},
                                  {"in_flight_tokens", l->in_flight_tokens},
                                  {"routed", l->routed},
                                  {"prefix_hit_ratio", l->routed_blocks ? json::value(double(l->matched_blocks) /
                                                                                      double(l->routed_blocks))
                                                                        : json::value(nullptr)},
                                  {"dp_ranks", ranks_json(*l)},
                                  {"pd_pool", l->pd_pool == ReplicaPool::prefill  ? "prefill"
                                              : l->pd_pool == ReplicaPool::decode ? "decode"
                                                                                  : "mixed"}});
    }
    active = active_;
    queued = waiting_room_.size();
    const TreeStats s = index_.tree().stats();
    tree = json::object{{"nodes", s.nodes},     {"blocks", s.blocks},
                        {"entries", s.entries}, {"bytes", s.bytes},
                        {"pending_blocks", index_.pending_blocks()},
                        {"pending_confirmed", index_.pending_confirmed()},
                        {"pending_expired", index_.pending_expired()},
                        {"tier_index_blocks", index_.tiers().size()},
                        {"tier_index_evicted", index_.tiers().evicted()}};
  }
  json::array events;
  {
    std::lock_guard lock(events_mutex_);
    for (const RecentEvent& e : recent_events_)
      events.push_back(json::object{{"time_ms", e.time_ms}, {"replica", e.replica}, {"what", e.what}});
  }
  http::Response r = http::json_response(200, json::object{{"policy", policy()->name()}, {"active", active},
                                                           {"queued", queued}, {"replicas", list}, {"tree", tree},
                                                           {"recent_errors", events}});
  co_await w.send(std::move(r));
}

awaitable<void> Gateway::add_replica_handler(const http::Request& req, http::ResponseWriter& w) {
  const std::string url = url_param(req);
  std::shared_ptr<ReplicaLink> link;
  std::string error;
  try {
    link = add_replica(url);
  } catch (const std::invalid_argument& e) {
    error = e.what();
  }
  if (!link) {
    co_await w.send(http::json_error(400, error, "invalid_request_error", "url"));
    co_return;
  }
  start_loops(link);
  http::Response r = http::json_response(201, json::object{{"url", url}, {"slot", link->slot}});
  co_await w.send(std::move(r));
}

awaitable<void> Gateway::remove_replica_handler(const http::Request& req, http::ResponseWriter& w) {
  const std::string url = url_param(req);
  if (!remove_replica(url)) {
    co_await w.send(http::json_error(404, "no replica '" + url + "'", "not_found_error", "url"));
    co_return;
  }
  http::Response r = http::json_response(200, json::object{{"removed", url}});
  co_await w.send(std::move(r));
}

awaitable<void> Gateway::drain_replica_handler(const http::Request& req, http::ResponseWriter& w) {
  const std::string url = url_param(req);
  bool found = false;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_)
      if (l->url == url) l->draining = found = true;
  }
  if (!found) {
    co_await w.send(http::json_error(404, "no replica '" + url + "'", "not_found_error", "url"));
    co_return;
  }
  http::Response r = http::json_response(200, json::object{{"draining", url}});
  co_await w.send(std::move(r));
}

// prometheus-cpp keeps a series until it is removed from its family; registering a family by its name
// again returns the existing one, so each family is reached through the registry's builder.
void Gateway::forget_metrics(const ReplicaLink& link) {
  const std::string& url = link.url;
  prometheus::Registry& registry = *metrics_.registry();
  const http::MetricLabels labels{{"replica", url}};
  const std::pair<const char*, const char*> gauges[] = {
      {"kvfleet_router_replica_healthy", "1 when the replica takes requests"},
      {"kvfleet_router_replica_in_flight_requests", "Requests in flight"},
      {"kvfleet_router_circuit_breaker_state", "Per replica: 0 closed, 1 open, 2 half-open"},
      {"kvfleet_router_upstream_idle_connections", "Pooled keep-alive connections to the replica"},
      {"kvfleet_router_replica_exact_mode", "1 when following the replica's KV events"}};
  for (const auto& [name, help] : gauges) {
    auto& family = prometheus::BuildGauge().Name(name).Help(help).Register(registry);
    if (family.Has(labels)) family.Remove(&family.Add(labels));
  }
  auto& ranks = prometheus::BuildCounter()
                    .Name("kvfleet_router_dp_rank_decisions_total")
                    .Help("Requests routed to each data-parallel rank")
                    .Register(registry);
  for (std::uint32_t k = 0; k < link.most_ranks; ++k) {
    const http::MetricLabels l{{"replica", url}, {"dp_rank", std::to_string(k)}};
    if (ranks.Has(l)) ranks.Remove(&ranks.Add(l));
  }
  // Held to the end: count_series() takes it too, and sees `removed` (set before this runs) under it.
  std::lock_guard series_lock(series_mutex_);
  for (auto it = request_series_.lower_bound({url, "", "", ""}); it != request_series_.end() && std::get<0>(*it) == url;) {
    const auto& [replica, status, name, help] = *it;
    auto& family = prometheus::BuildCounter().Name(name).Help(help).Register(registry);
    const http::MetricLabels l{{"replica", replica}, {"status", status}};
    if (family.Has(l)) family.Remove(&family.Add(l));
    it = request_series_.erase(it);
  }
}

namespace {

// The Bearer token of the request; nullopt without one.
std::optional<std::string_view> bearer(const http::Request& req) {
  const std::string* h = req.headers.find("Authorization");
  constexpr std::string_view prefix = "Bearer ";
  if (!h || h->size() < prefix.size() || !std::equal(prefix.begin(), prefix.end(), h->begin())) return std::nullopt;
  return std::string_view(*h).substr(prefix.size());
}

bool loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

bool Gateway::authorized(const http::Request& req) const {
  std::lock_guard lock(mutex_);
  if (api_keys_.empty()) return true;
  const auto key = bearer(req);
  if (!key) return false;
  bool match = false;
  for (const auto& k : api_keys_) match |= secure_equal(*key, k);  // no early exit
  return match;
}

bool Gateway::admin_authorized(const http::Request& req, int& status, std::string& why) const {
  std::lock_guard lock(mutex_);
  if (admin_api_key_.empty()) {
    if (api_keys_.empty() && loopback_host(config_.host)) return true;
    status = 403;
    why = "the admin API is off: set admin_api_key (--admin-api-key) to use it";
    return false;
  }
  const auto key = bearer(req);
  if (key && secure_equal(*key, admin_api_key_)) return true;
  status = 401;
  why = "invalid or missing admin API key (Authorization: Bearer ADMIN_KEY)";
  return false;
}

}  // namespace kvfleet::router
