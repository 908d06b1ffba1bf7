#include "router/gateway/gateway.h"

#include <algorithm>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <filesystem>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>

#include "kvfleet/http/json_error.h"

namespace kvfleet::router {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

std::string default_name(const std::string& model_dir) {
  std::filesystem::path d(model_dir);
  if (!d.has_filename()) d = d.parent_path();
  return std::filesystem::absolute(d).lexically_normal().filename().string();
}

ReplicaCacheConfig cache_config(const RouterConfig& c, BlockHash root) {
  ReplicaCacheConfig r;
  r.block_size = c.block_size;
  r.root = root;
  r.approximate_ttl = static_cast<Tick>(c.approximate_ttl.count());
  r.tree.max_bytes = c.tree_max_bytes;
  return r;
}

http::Response json_response(int status, const json::value& v) { return http::Response::json(status, json::serialize(v)); }

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

}  // namespace

Gateway::Gateway(RouterConfig config)
    : config_(std::move(config)),
      name_(config_.served_model_name.empty() ? default_name(config_.model) : config_.served_model_name),
      tokenizer_(Tokenizer::load(config_.model)),
      index_(cache_config(config_, block_hash_root(name_)),
             [](std::string_view line) { std::fprintf(stderr, "kvfleet-router: %.*s\n", int(line.size()), line.data()); }),
      policy_(make_policy(config_.policy)), api_keys_(config_.api_keys), admin_api_key_(config_.admin_api_key) {
  std::string why;
  chat_template_ = ChatTemplate::from_model_dir(config_.model, &why);
  if (!chat_template_)
    std::fprintf(stderr, "kvfleet-router: no usable chat template (%s); chat prompts route without hashes\n", why.c_str());
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  http::HttpServerConfig hc;
  hc.host = config_.host;
  hc.port = config_.port;
  hc.io_threads = config_.http_threads;
  hc.read_timeout = config_.read_timeout;
  hc.body_limit = config_.max_body_bytes;
  hc.write_timeout = config_.client_write_timeout;
  hc.max_connections = config_.max_concurrency + config_.max_queue + 64;
  server_ = std::make_unique<http::HttpServer>(hc, make_routes());
  for (const auto& url : config_.replicas) add_replica(url);
  for (const auto& url : config_.decode_replicas) add_replica(url, ReplicaPool::decode);
  for (const auto& url : config_.prefill_replicas) add_replica(url, ReplicaPool::prefill);
}

Gateway::~Gateway() {
  stopping_ = true;
  server_->stop(std::chrono::milliseconds(0));
  // Pooled upstream sockets belong to the io_context: close them while it still exists.
  for (const auto& link : links_) link->pool.clear();
  server_.reset();  // destroys the io_context, and with it the suspended background loops
}

void Gateway::start() {
  server_->start();
  std::vector<std::shared_ptr<ReplicaLink>> links;
  {
    std::lock_guard lock(mutex_);
    links = links_;
  }
  for (const auto& link : links) start_loops(link);
  asio::co_spawn(server_->executor(), maintenance_loop(), asio::detached);
}

bool Gateway::drain() {
  draining_ = true;
  const bool clean = server_->stop(config_.drain_timeout);
  stopping_ = true;
  return clean;
}

Tick Gateway::now_tick() {
  using namespace std::chrono;
  return static_cast<Tick>(duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count());
}

http::HttpRouter Gateway::make_routes() {
  http::HttpRouter r;
  auto bind = [this](auto method) {
    return [this, method](const http::Request& req, http::ResponseWriter& w) { return (this->*method)(req, w); };
  };
  r.post("/v1/completions", bind(&Gateway::proxy));
  r.post("/v1/chat/completions", bind(&Gateway::proxy));
  r.get("/v1/models", bind(&Gateway::models));
  r.get("/health", bind(&Gateway::health));
  r.get("/metrics", bind(&Gateway::metrics));
  auto admin = [this](AdminHandler method) {
    return [this, method](const http::Request& req, http::ResponseWriter& w) { return admin_guard(method, req, w); };
  };
  r.get("/admin/replicas", admin(&Gateway::list_replicas));
  r.post("/admin/replicas", admin(&Gateway::add_replica_handler));
  r.add("DELETE", "/admin/replicas", admin(&Gateway::remove_replica_handler));
  r.post("/admin/replicas/drain", admin(&Gateway::drain_replica_handler));
  return r;
}

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

awaitable<void> Gateway::models(const http::Request& req, http::ResponseWriter& w) {
  if (!authorized(req)) {
    co_await w.send(http::json_error(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                     "authentication_error", "", "invalid_api_key"));
    co_return;
  }
  json::object model{{"id", name_}, {"object", "model"}, {"created", created_}, {"owned_by", "kvfleet"}};
  http::Response r = json_response(200, json::object{{"object", "list"}, {"data", json::array{model}}});
  co_await w.send(std::move(r));
}

awaitable<void> Gateway::health(const http::Request&, http::ResponseWriter& w) {
  std::size_t healthy = 0;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_) healthy += l->healthy && !l->draining;
  }
  const bool ok = healthy > 0 && !draining_;
  http::Response r = json_response(ok ? 200 : 503, json::object{{"status", ok ? "ok" : "unavailable"},
                                                                 {"healthy_replicas", healthy}});
  co_await w.send(std::move(r));
}

awaitable<void> Gateway::metrics(const http::Request&, http::ResponseWriter& w) {
  TreeStats stats;
  {
    std::lock_guard lock(mutex_);
    stats = index_.tree().stats();
    for (const auto& l : links_) {
      const http::MetricLabels labels{{"replica", l->url}};
      metrics_.gauge("kvfleet_router_replica_healthy", "1 when the replica takes requests", labels)
          .Set(l->healthy && !l->draining ? 1 : 0);
      metrics_.gauge("kvfleet_router_replica_in_flight_requests", "Requests in flight", labels).Set(l->in_flight);
      metrics_.gauge("kvfleet_router_circuit_breaker_state", "Per replica: 0 closed, 1 open, 2 half-open", labels)
          .Set(static_cast<double>(l->breaker.state()));
      metrics_.gauge("kvfleet_router_upstream_idle_connections", "Pooled keep-alive connections to the replica", labels)
          .Set(double(l->pool.idle()));
      metrics_.gauge("kvfleet_router_replica_exact_mode", "1 when following the replica's KV events", labels)
          .Set(index_.mode(l->slot) == CacheMode::exact ? 1 : 0);
    }
  }
  metrics_.gauge("kvfleet_router_tree_nodes", "Prefix tree nodes").Set(double(stats.nodes));
  metrics_.gauge("kvfleet_router_tree_blocks", "Distinct block hashes in the tree").Set(double(stats.blocks));
  metrics_.gauge("kvfleet_router_tree_entries", "(block, replica) marks in the tree").Set(double(stats.entries));
  metrics_.gauge("kvfleet_router_tree_bytes", "Prefix tree memory estimate").Set(double(stats.bytes));
  co_await w.send(metrics_.response());
}

awaitable<void> Gateway::list_replicas(const http::Request&, http::ResponseWriter& w) {
  json::array list;
  json::object tree;
  std::size_t active = 0, queued = 0;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_) {
      list.push_back(json::object{{"url", l->url},
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
                                  {"in_flight_requests", l->in_flight},
                                  {"in_flight_tokens", l->in_flight_tokens},
                                  {"routed", l->routed}});
    }
    active = active_;
    queued = waiters_.size();
    const TreeStats s = index_.tree().stats();
    tree = json::object{{"nodes", s.nodes}, {"blocks", s.blocks}, {"entries", s.entries}, {"bytes", s.bytes}};
  }
  http::Response r = json_response(200, json::object{{"policy", policy()->name()}, {"active", active}, {"queued", queued},
                                                     {"replicas", list}, {"tree", tree}});
  co_await w.send(std::move(r));
}

std::shared_ptr<ReplicaLink> Gateway::add_replica(const std::string& url, ReplicaPool pd_pool) {
  const ReplicaAddress address = parse_replica_url(url);
  std::lock_guard lock(mutex_);
  std::array<bool, kMaxReplicas> used{};
  for (const auto& l : links_) {
    if (l->url == url) throw std::invalid_argument("replica '" + url + "' is already configured");
    used[l->slot] = true;
  }
  ReplicaId slot = 0;
  while (slot < kMaxReplicas && used[slot]) ++slot;
  if (slot == kMaxReplicas) throw std::invalid_argument("at most 64 replicas");
  UpstreamPoolConfig pool;
  pool.max_idle = config_.upstream_keepalive;
  pool.idle_timeout = config_.upstream_idle_timeout;
  auto link = std::make_shared<ReplicaLink>(url, address, slot, server_->executor(), pool, config_.circuit_breaker);
  link->pd_pool = pd_pool;
  index_.add_replica(slot);
  links_.push_back(link);
  return link;
}

bool Gateway::remove_replica(const std::string& url) {
  std::shared_ptr<ReplicaLink> link;
  {
    std::lock_guard lock(mutex_);
    for (auto it = links_.begin(); it != links_.end(); ++it) {
      if ((*it)->url != url) continue;
      link = *it;
      links_.erase(it);
      break;
    }
    if (!link) return false;
    link->removed = true;  // under the lock: its loops check it there before touching the index
    index_.remove_replica(link->slot);
    forget_metrics(url);  // under the lock: metrics() sets the gauges of listed replicas under it too
  }
  link->pool.clear();
  asio::post(link->strand, [link] {
    if (link->events_client) link->events_client->close();
  });
  return true;
}

// prometheus-cpp keeps a series until it is removed from its family; registering a family by its name
// again returns the existing one, so each family is reached through the registry's builder.
void Gateway::forget_metrics(const std::string& url) {
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
  std::vector<std::pair<std::string, std::string>> series;
  {
    std::lock_guard lock(series_mutex_);
    for (auto it = request_series_.begin(); it != request_series_.end();) {
      if (it->first == url) {
        series.push_back(*it);
        it = request_series_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const std::pair<const char*, const char*> counters[] = {
      {"kvfleet_router_requests_total", "Requests answered, by replica and HTTP status"},
      {"kvfleet_router_upstream_overloaded_total", "503/429 answers retried on another replica"}};
  for (const auto& [name, help] : counters) {
    auto& family = prometheus::BuildCounter().Name(name).Help(help).Register(registry);
    for (const auto& [replica, status] : series) {
      const http::MetricLabels l{{"replica", replica}, {"status", status}};
      if (family.Has(l)) family.Remove(&family.Add(l));
    }
  }
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
  http::Response r = json_response(201, json::object{{"url", url}, {"slot", link->slot}});
  co_await w.send(std::move(r));
}

awaitable<void> Gateway::remove_replica_handler(const http::Request& req, http::ResponseWriter& w) {
  const std::string url = url_param(req);
  if (!remove_replica(url)) {
    co_await w.send(http::json_error(404, "no replica '" + url + "'", "not_found_error", "url"));
    co_return;
  }
  http::Response r = json_response(200, json::object{{"removed", url}});
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
  http::Response r = json_response(200, json::object{{"draining", url}});
  co_await w.send(std::move(r));
}

// Ages out approximate marks (the index does not run a clock of its own) and idle upstream connections.
awaitable<void> Gateway::maintenance_loop() {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!stopping_) {
    timer.expires_after(std::chrono::seconds(1));
    co_await timer.async_wait(asio::use_awaitable);
    std::vector<std::shared_ptr<ReplicaLink>> links;
    {
      std::lock_guard lock(mutex_);
      index_.sweep(now_tick());
      links = links_;
    }
    for (const auto& l : links) l->pool.prune();
  }
}

void Gateway::count_request(const std::string& replica, const std::string& status) {
  metrics_.counter("kvfleet_router_requests_total", "Requests answered, by replica and HTTP status",
                   {{"replica", replica}, {"status", status}})
      .Increment();
  std::lock_guard lock(series_mutex_);
  request_series_.emplace(replica, status);
}

namespace {

// Equal strings, in a time that depends on their lengths only (not on where they differ).
bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

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
  for (const auto& k : api_keys_) match |= constant_time_equal(*key, k);  // no early exit
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
  if (key && constant_time_equal(*key, admin_api_key_)) return true;
  status = 401;
  why = "invalid or missing admin API key (Authorization: Bearer ADMIN_KEY)";
  return false;
}

std::shared_ptr<Policy> Gateway::policy() const {
  std::lock_guard lock(mutex_);
  return policy_;
}

std::string Gateway::reload(const RouterConfig& next) {
  std::vector<std::string> current;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_) current.push_back(l->url);
  }
  auto has = [](const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  std::string report;
  for (const auto& url : next.replicas) {
    if (has(current, url)) continue;
    start_loops(add_replica(url));
    report += "added replica " + url + "; ";
  }
  for (const auto& url : current) {
    if (has(next.replicas, url)) continue;
    remove_replica(url);
    report += "removed replica " + url + "; ";
  }
  std::shared_ptr<Policy> policy = make_policy(next.policy);
  {
    std::lock_guard lock(mutex_);
    policy_.swap(policy);  // the old one is destroyed outside the lock, once no request holds it
    api_keys_ = next.api_keys;
    admin_api_key_ = next.admin_api_key;
  }
  report += "policy and API keys applied";
  if (next.model != config_.model || next.port != config_.port || next.host != config_.host ||
      next.block_size != config_.block_size)
    report += "; model, host, port and block_size changes need a restart";
  return report;
}

}  // namespace kvfleet::router
