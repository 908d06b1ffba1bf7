#include "router/gateway/gateway.h"

#include "kvfleet/chat_tools.h"
#include "router/dashboard/dashboard.h"

#include <algorithm>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <filesystem>

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
  r.pending_ttl = static_cast<Tick>(c.pending_ttl.count());
  r.tree.max_bytes = c.tree_max_bytes;
  r.tiers.max_blocks = static_cast<std::size_t>(c.tier_index_max_blocks);
  return r;
}

}  // namespace

Gateway::Gateway(RouterConfig config, Discovery::Resolver resolver)
    : config_(std::move(config)),
      name_(config_.served_model_name.empty() ? default_name(config_.model) : config_.served_model_name),
      tokenizer_(Tokenizer::load(config_.model)),
      index_(cache_config(config_, block_hash_root(name_)),
             [](std::string_view line) { std::fprintf(stderr, "kvfleet-router: %.*s\n", int(line.size()), line.data()); }),
      policy_(make_policy(config_.policy)), api_keys_(config_.api_keys), admin_api_key_(config_.admin_api_key) {
  waiting_room_.set_capacity(config_.max_queue);
  waiting_room_.set_weights(config_.tenant_weights);
  std::string why;
  chat_template_ = ChatTemplate::from_model_dir(config_.model, &why);
  if (!chat_template_)
    std::fprintf(stderr, "kvfleet-router: no usable chat template (%s); chat prompts route without hashes\n", why.c_str());
  if (chat_template_) template_renders_tools_ = tools::template_renders_tools(*chat_template_);
  if (!config_.tool_call_parser.empty() && !(tool_parser_ = tools::make_tool_parser(config_.tool_call_parser)))
    throw std::invalid_argument("unknown tool call parser '" + config_.tool_call_parser + "' (known: " +
                                tools::tool_parser_names() + ")");
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  http::HttpServerConfig hc;
  hc.host = config_.host;
  hc.port = config_.port;
  hc.io_threads = config_.http_threads;
  hc.read_timeout = config_.read_timeout;
  hc.body_limit = config_.max_body_bytes;
  hc.write_timeout = config_.client_write_timeout;
  hc.header_timeout = config_.header_timeout;
  hc.max_connections = config_.max_concurrency + config_.max_queue + 64;
  hc.max_connections_per_peer = config_.max_connections_per_peer;
  // Probes and the operator's endpoints answer past the connection caps (their handlers never queue).
  hc.priority_paths = {"/health", "/readiness", "/liveness", "/metrics", "/admin/"};
  server_ = std::make_unique<http::HttpServer>(hc, make_routes());
  if (!config_.otlp_endpoint.empty()) {
    trace::ExporterConfig ec;
    ec.endpoint = config_.otlp_endpoint;
    ec.service_name = "kvfleet-router";
    spans_ = std::make_unique<trace::SpanExporter>(ec, metrics_);
  }
  for (const auto& url : config_.replicas) add_replica(url);
  for (const auto& url : config_.decode_replicas) add_replica(url, ReplicaPool::decode);
  for (const auto& url : config_.prefill_replicas) add_replica(url, ReplicaPool::prefill);
  if (!config_.discovery.dns.empty()) {
    if (!resolver)
      resolver = config_.discovery.hosts_file.empty() ? Discovery::system_resolver()
                                                      : Discovery::hosts_file_resolver(config_.discovery.hosts_file);
    discovery_ = std::make_unique<Discovery>(config_.discovery, std::move(resolver),
                                             [this](const std::vector<std::string>& urls) { apply_discovered(urls); });
  }
  // Last: nothing after it may throw (a joinable thread must not be destroyed).
  health_work_.emplace(asio::make_work_guard(health_ioc_));
  health_thread_ = std::thread([this] { health_ioc_.run(); });
}

// Order matters (ASan found the old one): the suspended loops' frames hold their links, whose strands
// and timers belong to the io_contexts. So: stop the server (no new requests, connections closed, io
// threads joined), end every loop (the event loops on the server's io_context, the health loops on the
// health thread), stop the health thread, close pooled sockets, drop the links, and only then destroy
// the server with its io_context (the health io_context, a member, goes after).
Gateway::~Gateway() {
  discovery_.reset();  // its thread adds and removes replicas
  stopping_ = true;
  draining_ = true;
  server_->stop(std::chrono::milliseconds(0));
  finish_loops();
  health_work_.reset();
  health_ioc_.stop();
  if (health_thread_.joinable()) health_thread_.join();
  std::vector<std::shared_ptr<ReplicaLink>> links;
  {
    std::lock_guard lock(mutex_);
    links.swap(links_);
  }
  for (const auto& link : links) link->pool.clear();
  links.clear();
  maintenance_timer_.reset();
  server_.reset();
}

void Gateway::finish_loops() {
  std::vector<std::shared_ptr<ReplicaLink>> links;
  {
    std::lock_guard lock(mutex_);
    links = links_;
  }
  // The server's io threads are joined: this thread runs the io_context until the loops are done.
  auto& ioc = static_cast<asio::io_context&>(asio::query(server_->executor(), asio::execution::context));
  ioc.restart();
  for (const auto& link : links) ReplicaLink::stop_io(link);
  asio::post(server_->executor(), [this] {
    if (maintenance_timer_) maintenance_timer_->cancel();
  });
  // Bounded: each loop ends at its next resumption, which the cancels above bring at once.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (loops_ > 0 && std::chrono::steady_clock::now() < deadline) ioc.run_one_for(std::chrono::milliseconds(50));
  if (loops_ > 0) std::fprintf(stderr, "kvfleet-router: %d background loops did not end at shutdown\n", loops_.load());
  ioc.stop();
}

void Gateway::start() {
  server_->start();
  std::vector<std::shared_ptr<ReplicaLink>> links;
  {
    std::lock_guard lock(mutex_);
    links = links_;
  }
  for (const auto& link : links) start_loops(link);
  maintenance_timer_.emplace(server_->executor());
  loops_ += 1;
  asio::co_spawn(server_->executor(), maintenance_loop(), [this](const std::exception_ptr&) { loops_ -= 1; });
  if (discovery_) discovery_->start();
}

bool Gateway::drain() {
  draining_ = true;
  discovery_.reset();
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
  r.post("/v1/responses", bind(&Gateway::proxy));
  r.add_prefix("GET", "/v1/responses/", bind(&Gateway::response_by_id));
  r.add_prefix("DELETE", "/v1/responses/", bind(&Gateway::response_by_id));
  r.get("/v1/models", bind(&Gateway::models));
  // Probes as SGLang's gateway has them: /readiness (= /health: 503 with no healthy replica or while
  // draining) for the balancer, /liveness (200 while the process serves) for restarts.
  r.get("/health", bind(&Gateway::health));
  r.get("/readiness", bind(&Gateway::health));
  r.get("/liveness", bind(&Gateway::liveness));
  r.get("/metrics", bind(&Gateway::metrics));
  r.get("/dashboard", bind(&Gateway::dashboard));
  auto admin = [this](AdminHandler method) {
    return [this, method](const http::Request& req, http::ResponseWriter& w) { return admin_guard(method, req, w); };
  };
  r.get("/admin/replicas", admin(&Gateway::list_replicas));
  r.post("/admin/replicas", admin(&Gateway::add_replica_handler));
  r.add("DELETE", "/admin/replicas", admin(&Gateway::remove_replica_handler));
  r.post("/admin/replicas/drain", admin(&Gateway::drain_replica_handler));
  return r;
}

awaitable<void> Gateway::models(const http::Request& req, http::ResponseWriter& w) {
  if (!authorized(req)) {
    co_await w.send(http::json_error(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                     "authentication_error", "", "invalid_api_key"));
    co_return;
  }
  json::object model{{"id", name_}, {"object", "model"}, {"created", created_}, {"owned_by", "kvfleet"}};
  // The replicas' context length (the least of those that said: what every one of them can serve).
  std::optional<std::int64_t> max_model_len;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_)
      if (l->max_model_len) max_model_len = std::min(max_model_len.value_or(*l->max_model_len), *l->max_model_len);
  }
  if (max_model_len) model["max_model_len"] = *max_model_len;
  http::Response r = http::json_response(200, json::object{{"object", "list"}, {"data", json::array{model}}});
  co_await w.send(std::move(r));
}

awaitable<void> Gateway::health(const http::Request&, http::ResponseWriter& w) {
  std::size_t healthy = 0;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_) healthy += l->healthy && !l->draining;
  }
  const bool ok = healthy > 0 && !draining_;
  http::Response r = http::json_response(ok ? 200 : 503, json::object{{"status", ok ? "ok" : "unavailable"},
                                                                       {"healthy_replicas", healthy}});
  co_await w.send(std::move(r));
}

awaitable<void> Gateway::liveness(const http::Request&, http::ResponseWriter& w) {
  json::object body;
  body["status"] = "alive";
  http::Response r = http::json_response(200, std::move(body));
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

std::shared_ptr<ReplicaLink> Gateway::add_replica(const std::string& url, ReplicaPool pd_pool) {
  const ReplicaAddress address = parse_replica_url(url);
  std::lock_guard lock(mutex_);
  std::array<bool, kMaxReplicas> used{};
  for (const auto& l : links_) {
    if (l->url == url) throw std::invalid_argument("replica '" + url + "' is already configured");
    used[l->slot] = true;
  }
  ReplicaId slot = 0;
  while (slot < kMaxReplicas && (used[slot] || index_.in_use(slot))) ++slot;  // ranks take slots too
  if (slot == kMaxReplicas) throw std::invalid_argument("at most 64 replicas (each data-parallel rank counts as one)");
  UpstreamPoolConfig pool;
  pool.max_idle = config_.upstream_keepalive;
  pool.idle_timeout = config_.upstream_idle_timeout;
  auto link = std::make_shared<ReplicaLink>(url, address, slot, server_->executor(), health_ioc_.get_executor(), pool,
                                            config_.circuit_breaker);
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
    forget_metrics(*link);  // under the lock: metrics() sets the gauges of listed replicas under it too
  }
  link->pool.clear();
  response_owners_.forget_replica(url);
  ReplicaLink::stop_io(link);  // its loops end at once
  return true;
}

void Gateway::apply_discovered(const std::vector<std::string>& urls) {
  if (stopping_ || draining_) return;
  std::vector<std::string> added, gone;
  {
    std::lock_guard lock(mutex_);
    for (const auto& url : urls)
      if (std::none_of(links_.begin(), links_.end(), [&](const auto& l) { return l->url == url; })) added.push_back(url);
    for (const auto& l : links_)
      if (l->discovered && std::find(urls.begin(), urls.end(), l->url) == urls.end()) gone.push_back(l->url);
  }
  for (const auto& url : added) {
    try {
      const std::shared_ptr<ReplicaLink> link = add_replica(url);
      {
        std::lock_guard lock(mutex_);
        link->discovered = true;
      }
      start_loops(link);
      std::fprintf(stderr, "kvfleet-router: discovery: added replica %s\n", url.c_str());
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "kvfleet-router: discovery: cannot add %s: %s\n", url.c_str(), e.what());
    }
  }
  for (const auto& url : gone) {
    remove_replica(url);
    std::fprintf(stderr, "kvfleet-router: discovery: removed replica %s\n", url.c_str());
  }
}

// Ages out approximate marks (the index does not run a clock of its own) and idle upstream connections.
awaitable<void> Gateway::maintenance_loop() {
  asio::steady_timer& timer = *maintenance_timer_;
  while (!stopping_) {
    timer.expires_after(std::chrono::seconds(1));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping_) break;
    std::vector<std::shared_ptr<ReplicaLink>> links;
    {
      std::lock_guard lock(mutex_);
      index_.sweep(now_tick());
      links = links_;
    }
    for (const auto& l : links) l->pool.prune();
  }
}

// Under series_mutex_, which forget_metrics holds while it removes the series: a request that ends after
// its replica's removal (`removed` is set before) adds nothing, one that ended before is removed with it.
void Gateway::count_series(const char* family, const char* help, const std::string& replica, const std::string& status,
                           const ReplicaLink* link) {
  std::lock_guard lock(series_mutex_);
  if (link && link->removed) return;
  metrics_.counter(family, help, {{"replica", replica}, {"status", status}}).Increment();
  request_series_.emplace(replica, status, family, help);
}

void Gateway::count_request(const std::string& replica, const std::string& status, const ReplicaLink* link) {
  count_series("kvfleet_router_requests_total", "Requests answered, by replica and HTTP status", replica, status, link);
  // A client's own mistake (4xx other than 429) is not the fleet's error.
  const bool client_error = status.size() == 3 && status[0] == '4' && status != "429";
  if (status.empty() || status[0] == '2' || client_error) return;
  note_event(replica, status[0] >= '0' && status[0] <= '9' ? "answered " + status : status);
}

void Gateway::note_event(const std::string& replica, std::string what) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  std::lock_guard lock(events_mutex_);
  if (recent_events_.size() == kRecentEvents) recent_events_.pop_front();
  recent_events_.push_back({ms, replica, std::move(what)});
}

// The page is static (router/dashboard/dashboard.h); its data comes from the admin API, which checks the key.
awaitable<void> Gateway::dashboard(const http::Request&, http::ResponseWriter& w) {
  http::Response r;
  r.status = 200;
  r.headers.set("Content-Type", "text/html; charset=utf-8");
  r.headers.set("Cache-Control", "no-store");
  // Nothing from elsewhere: the page's own inline script and style, fetches to this router only.
  r.headers.set("Content-Security-Policy",
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'");
  r.body = std::string(dashboard_html());
  co_await w.send(std::move(r));
}

void Gateway::count_overloaded(const ReplicaLink& link, int status) {
  count_series("kvfleet_router_upstream_overloaded_total", "503/429 answers retried on another replica", link.url,
               std::to_string(status), &link);
}

std::shared_ptr<Policy> Gateway::policy() const {
  std::lock_guard lock(mutex_);
  return policy_;
}

std::string Gateway::reload(const RouterConfig& next) {
  std::vector<std::string> current, all;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_) {
      all.push_back(l->url);
      if (!l->discovered) current.push_back(l->url);  // discovery keeps its own
    }
  }
  auto has = [](const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  std::string report;
  // Policy and keys first: once the new replica list shows (in /admin), the rest has been applied too.
  std::shared_ptr<Policy> policy = make_policy(next.policy);
  {
    std::lock_guard lock(mutex_);
    policy_.swap(policy);  // the old one is destroyed outside the lock, once no request holds it
    api_keys_ = next.api_keys;
    admin_api_key_ = next.admin_api_key;
    waiting_room_.set_weights(next.tenant_weights);
  }
  for (const auto& url : next.replicas) {
    if (has(all, url)) continue;
    start_loops(add_replica(url));
    report += "added replica " + url + "; ";
  }
  for (const auto& url : current) {
    if (has(next.replicas, url)) continue;
    remove_replica(url);
    report += "removed replica " + url + "; ";
  }
  report += "policy, API keys and tenant weights applied";
  if (next.model != config_.model || next.port != config_.port || next.host != config_.host ||
      next.block_size != config_.block_size)
    report += "; model, host, port and block_size changes need a restart";
  return report;
}

}  // namespace kvfleet::router
