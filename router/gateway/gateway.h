// Gateway: the kvfleet-router process. An HttpServer whose OpenAI handlers tokenize the prompt,
// hash its blocks (Contract 1), ask the ReplicaCacheIndex which replica holds how much of it, let
// the policy choose, and relay the request to that replica piece by piece (SSE passes through).
//
// Files: gateway.cpp (setup, local endpoints, metrics, replica set), admin.cpp (admin API, API
// keys, metric cleanup of removed replicas), routing.cpp (prompt -> hashes
// -> decision, in-flight bookkeeping), proxy.cpp (admission, forwarding, retries, relaying),
// replica_links.cpp (per replica: active health checks and the KV event subscription), tracing.cpp (spans).
//
// Threading: the HttpServer's io threads run every handler and background loop. All routing state
// (the index, the policy, the replica list and each ReplicaLink's fields except `removed`) sits
// behind one mutex (mutex_), held only for short non-blocking sections, never across a co_await.
// Each replica's background loops run on that replica's strand, where its events client lives.
#pragma once

#include <atomic>
#include <deque>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/json/object.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kvfleet/chat_template.h"
#include "kvfleet/tool_parser.h"
#include "kvfleet/http/client.h"
#include "kvfleet/http/metrics.h"
#include "kvfleet/http/server.h"
#include "kvfleet/tokenizer.h"
#include "kvfleet/trace/exporter.h"
#include "router/circuit_breaker.h"
#include "router/flow/fair_queue.h"
#include "router/gateway/discovery.h"
#include "router/gateway/pd_routing.h"
#include "router/gateway/response_owners.h"
#include "router/gateway/router_config.h"
#include "router/gateway/stream_splice.h"
#include "router/gateway/upstream_pool.h"
#include "router/policy.h"
#include "router/replica_cache_index.h"

namespace kvfleet::router {

using boost::asio::awaitable;

// One data-parallel rank of an expert-parallel replica: a routing target of its own (its own tree slot,
// requests in flight and reported load) behind the replica's endpoint, health and circuit breaker.
struct RankTarget {
  ReplicaId slot = 0;
  std::uint32_t in_flight = 0;
  std::uint64_t in_flight_tokens = 0;
  std::uint64_t routed = 0;
  bool load_reported = false;  // the rank's `load` events (per_rank stream)
  std::uint32_t reported_waiting = 0, reported_running = 0;
  double reported_kv_usage = 0;
  Tick load_at = 0;
};

struct ReplicaLink {
  ReplicaLink(std::string url_, ReplicaAddress address_, ReplicaId slot_, boost::asio::any_io_executor executor,
              boost::asio::any_io_executor health_executor, UpstreamPoolConfig pool_config,
              CircuitBreakerConfig breaker_config)
      : url(std::move(url_)), address(std::move(address_)), slot(slot_), strand(boost::asio::make_strand(executor)),
        health_strand(boost::asio::make_strand(health_executor)), health_timer(health_strand), events_timer(strand),
        pool(pool_config), breaker(breaker_config) {}

  const std::string url;
  const ReplicaAddress address;
  const ReplicaId slot;
  // The KV event loop runs on `strand` (the server's io threads); the health loop on `health_strand`, an
  // io_context and thread of its own, so that a flood of client traffic on the io threads cannot delay a
  // health check past its timeout and mark a healthy replica down.
  boost::asio::strand<boost::asio::any_io_executor> strand, health_strand;
  // The loops' sleeps (health_timer on health_strand, events_timer on strand), cancelled with the clients
  // below closed by stop_health() and stop_events().
  boost::asio::steady_timer health_timer, events_timer;
  std::atomic<bool> removed{false};
  UpstreamPool pool;  // idle keep-alive connections (thread-safe on its own)
  // Guarded by Gateway::mutex_.
  CircuitBreaker breaker;  // passive outlier ejection from request outcomes
  ReplicaPool pd_pool = ReplicaPool::mixed;  // pd mode: which pools it serves in
  bool healthy = true;     // active health checks (and a refused connection)
  bool draining = false;
  int fail_streak = 0, ok_streak = 0;
  std::uint32_t in_flight = 0;
  std::uint64_t in_flight_tokens = 0;
  std::uint64_t routed = 0;
  std::uint64_t routed_blocks = 0, matched_blocks = 0;  // prompt blocks routed to it, and those it held
  std::uint64_t events_applied = 0;
  bool discovered = false;  // added by DNS discovery (which may remove it again), not configured
  // The replica's own load (`load` events on its KV event stream); stale after kv_events_timeout.
  bool load_reported = false;
  std::uint32_t reported_waiting = 0, reported_running = 0;
  double reported_kv_usage = 0;
  Tick load_at = 0;
  // Expert-parallel replicas: one target per data-parallel rank (rank 0's slot is `slot`), from the
  // per-rank event stream's config; empty: the replica is one target. Kept while the stream is down.
  std::vector<RankTarget> ranks;
  std::uint32_t most_ranks = 0;  // the most it had: its dp_rank metric series to forget on removal
  std::optional<std::int64_t> max_model_len;  // from its /v1/models (read by the health loop)
  bool models_read = false;                   // its /v1/models answered 200 (with or without max_model_len)
  // The open KV event stream (used on `strand`) and health check (on `health_strand`), closed when the
  // replica is removed.
  std::shared_ptr<http::HttpClient> events_client, health_client;

  // Each on its strand: wakes that loop at once (it then sees `removed` or the gateway stopping and ends).
  void stop_events() {
    events_timer.cancel();
    if (events_client) events_client->close();
  }
  void stop_health() {
    health_timer.cancel();
    if (health_client) health_client->close();
  }
  // Posts both wake-ups to their strands.
  static void stop_io(const std::shared_ptr<ReplicaLink>& link) {
    boost::asio::post(link->strand, [link] { link->stop_events(); });
    boost::asio::post(link->health_strand, [link] { link->stop_health(); });
  }
};

// A request waiting for a forwarding slot; release_slot() sets `granted` and cancels the timer, and a
// newcomer that takes its place in a full waiting room (router/flow/fair_queue.h) sets `evicted`.
struct SlotWaiter {
  explicit SlotWaiter(boost::asio::any_io_executor executor) : timer(std::move(executor)) {}
  boost::asio::steady_timer timer;
  bool granted = false;  // guarded by Gateway::mutex_
  bool evicted = false;  // guarded by Gateway::mutex_
};

// Whose request it is and how urgent (flow.cpp): the waiting room's key.
struct FlowKey {
  std::string tenant = "default";
  std::int64_t priority = 0;  // lower first (vLLM's convention)
};

// How one try at a replica ended, for its circuit breaker and for the retry loop.
enum class Verdict { success, failure, unknown };
struct TryResult {
  Verdict verdict = Verdict::unknown;
  int status = 0;  // the replica's status code (0: no answer came)
  std::optional<http::Response> overloaded;  // a 503/429 answer that was retried rather than passed on
};

// A stream that may fail over mid-way (failover.cpp): what reached the client so far.
struct SpliceState {
  StreamSplice splice;
  bool begun = false;  // the client's stream (status, headers) is open
  int resumes = 0;     // resume requests sent
};

// One request's routing input.
struct RoutePlan {
  std::vector<BlockHash> hashes;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t expected_tokens = 0;  // prompt + max_tokens: the in-flight token load
  std::string session_key;
  std::string prefill_from;  // pd mode: the prefill replica route() picked (x-kvfleet-prefill-from)
  int dp_rank = -1;          // the rank route() picked on an expert-parallel replica (X-data-parallel-rank)
  // route()'s last decision, for its trace span: the policy's reason and the blocks the chosen target holds.
  std::string reason;
  std::uint32_t matched_blocks = 0;
};

class Gateway {
 public:
  // `resolver` serves discovery.dns (default: hosts_file when set, else the system's resolver).
  explicit Gateway(RouterConfig config, Discovery::Resolver resolver = {});
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  void start();  // binds, starts io threads and the per-replica loops
  std::uint16_t port() const { return server_->port(); }
  const std::string& model_name() const { return name_; }
  // SIGTERM: new requests get 503, running ones finish within drain_timeout. True if all did.
  bool drain();

  // SIGHUP: applies a re-read configuration's replica list (added ones start, missing ones are removed),
  // policy and API keys. Other settings need a restart; the returned text says what changed and what not.
  std::string reload(const RouterConfig& next);

  // A request's routing input: the prompt (chat: rendered through the template) tokenized and hashed into
  // blocks under its cache_salt, its expected token load, and its session key (the header the policy names).
  // It neither matches the index nor chooses a replica: route() does. Public so that bench_router_overhead
  // times the real code.
  RoutePlan plan(std::string_view path, const boost::json::object& body, const http::Request& request) const;

 private:
  // gateway.cpp
  http::HttpRouter make_routes();
  awaitable<void> models(const http::Request& req, http::ResponseWriter& w);
  awaitable<void> health(const http::Request& req, http::ResponseWriter& w);
  awaitable<void> liveness(const http::Request& req, http::ResponseWriter& w);
  awaitable<void> metrics(const http::Request& req, http::ResponseWriter& w);
  awaitable<void> dashboard(const http::Request& req, http::ResponseWriter& w);
  // admin.cpp
  using AdminHandler = awaitable<void> (Gateway::*)(const http::Request&, http::ResponseWriter&);
  awaitable<void> admin_guard(AdminHandler method, const http::Request& req, http::ResponseWriter& w);
  awaitable<void> list_replicas(const http::Request& req, http::ResponseWriter& w);
  awaitable<void> add_replica_handler(const http::Request& req, http::ResponseWriter& w);
  awaitable<void> remove_replica_handler(const http::Request& req, http::ResponseWriter& w);
  awaitable<void> drain_replica_handler(const http::Request& req, http::ResponseWriter& w);
  // gateway.cpp: the replica set
  std::shared_ptr<ReplicaLink> add_replica(const std::string& url,
                                           ReplicaPool pool = ReplicaPool::mixed);  // throws invalid_argument
  bool remove_replica(const std::string& url);
  // Discovery's answer: the discovered replicas are now exactly `urls` (configured ones stay).
  void apply_discovered(const std::vector<std::string>& urls);
  awaitable<void> maintenance_loop();

  // routing.cpp
  // The chosen replica (nullptr: none available), its in-flight load taken and its breaker ticket set;
  // plan.dp_rank names the chosen rank of a replica with ranks.
  std::shared_ptr<ReplicaLink> route(RoutePlan& plan, const std::vector<ReplicaId>& exclude,
                                     CircuitBreaker::Ticket& ticket);
  // One ReplicaState per routing target (a replica, or each rank of one) and, alongside, which (link
  // index, rank or -1) it is; mutex_ held.
  struct Target {
    std::size_t link;
    int rank;
  };
  void targets_locked(const TierMatch& match, const std::vector<ReplicaId>& exclude, Tick now,
                      std::vector<ReplicaState>& states, std::vector<Target>& targets);
  // A per-rank stream's config: the link's ranks follow its dp_size; mutex_ held.
  void set_ranks_locked(ReplicaLink& link, const KvEventMessage& config);
  void note_load_locked(ReplicaLink& link, const KvEventMessage& load);
  // pd mode (pd_routing.cpp): sets plan.prefill_from for the chosen D; mutex_ held.
  const char* choose_prefill_locked(RoutePlan& plan, const ReplicaLink& decode, std::uint32_t matched, Tick now);
  void release(ReplicaLink& link, const RoutePlan& plan, CircuitBreaker::Ticket ticket, Verdict verdict);
  void note_connect_refused(ReplicaLink& link);

  // proxy.cpp
  awaitable<void> proxy(const http::Request& req, http::ResponseWriter& w);
  // proxy() inside its router.request span: admission, routing, tries and relaying.
  awaitable<void> proxy_request(const http::Request& req, http::ResponseWriter& w, trace::Span& request_span,
                                const std::string& trace_state);
  // flow.cpp: tenants, priorities and the waiting room
  // The request's tenant and priority; an error message naming the field when they are malformed.
  std::optional<std::pair<std::string, std::string>> flow_of(const http::Request& req, const boost::json::object& body,
                                                             FlowKey& key) const;
  // A slot at once, or a place in the waiting room until release_slot() grants one. False: refused
  // (answer 429 with retry_after_seconds, unless the client left).
  awaitable<bool> admit(http::ResponseWriter& w, const FlowKey& flow);
  void release_slot(const std::string& tenant);
  // Slots a tenant may hold: max_concurrency x its weight / the weights of the tenants active now (at least 1).
  double active_weight_locked(double now);
  std::size_t slot_share_locked(const std::string& tenant, double active_weight) const;
  int retry_after_seconds(const std::string& tenant);
  void count_tenant(const std::string& tenant, const char* outcome);
  std::string tenant_label(const std::string& tenant);
  // broke: the client's stream is open and the replica's broke mid-way, resumable (`splice`).
  enum class Outcome { done, retry, broke };
  // `trace`: the upstream span's context, sent as the replica's traceparent (null: the client's
  // traceparent and tracestate pass through as they came).
  awaitable<Outcome> forward(ReplicaLink& link, const http::Request& req, http::ResponseWriter& w, bool last_try,
                             TryResult& result, SpliceState* splice = nullptr, const trace::SpanContext* trace = nullptr);
  // Sends `upstream` and reads the answer's head on a pooled connection, or a new one; a pooled
  // connection that turns out stale is replaced by a new one once. Throws on failure; sets `connected`.
  awaitable<http::ResponseHead> exchange(ReplicaLink& link, const http::Request& upstream,
                                         std::unique_ptr<http::HttpClient>& client, bool& connected);
  awaitable<Verdict> relay_stream(http::HttpClient& client, const http::ResponseHead& head, ReplicaLink& link,
                                  http::ResponseWriter& w, double started, bool responses_events);

  // responses.cpp: the Responses API's routing (its prompt, and the replica that stored a response)
  std::vector<TokenId> responses_prompt(const boost::json::object& body) const;
  awaitable<void> response_by_id(const http::Request& req, http::ResponseWriter& w);
  awaitable<std::shared_ptr<ReplicaLink>> find_response_owner(const std::string& id);
  std::shared_ptr<ReplicaLink> link_of(const std::string& url) const;
  std::vector<ReplicaId> all_but(const ReplicaLink& owner) const;

  // failover.cpp
  // A streamed chat or completions request with one choice: the kind a broken stream can resume.
  static bool failover_eligible(std::string_view path, const boost::json::object& body);
  // A sampled request without a seed: the router gives it one, so that a resumed stream stays exact.
  static bool needs_seed(const boost::json::object& body);
  // Relays the stream into the client's (opening it first), through the splice; stalls count as breaks.
  // True: the replica broke mid-way and the stream can resume elsewhere (nothing more was written);
  // false: it ended (cleanly, the client left, or with an error event).
  awaitable<bool> relay_spliced(http::HttpClient& client, const http::ResponseHead& head, ReplicaLink& link,
                                http::ResponseWriter& w, double started, SpliceState& s, TryResult& result);
  // Resumes a broken stream on other replicas (up to failover_max_attempts); ends it with an error event
  // and [DONE] when none can.
  awaitable<void> fail_over(const http::Request& req, const boost::json::object& body, RoutePlan& plan,
                            std::vector<ReplicaId>& tried, http::ResponseWriter& w, SpliceState& s,
                            trace::Span& request_span, const std::string& trace_state);

  // replica_links.cpp
  void start_loops(const std::shared_ptr<ReplicaLink>& link);
  // Shutdown: wakes every background loop and runs the (stopped) io_context on this thread until they
  // have all ended, so that no coroutine frame outlives the links or the io_context it runs on.
  void finish_loops();
  awaitable<void> health_loop(std::shared_ptr<ReplicaLink> link);
  awaitable<void> events_loop(std::shared_ptr<ReplicaLink> link);
  struct StreamEnd {
    std::string why = "stream ended";
    bool worked = false;  // events were applied: the backoff starts over
  };
  awaitable<StreamEnd> read_events(ReplicaLink& link, http::HttpClient& client);
  void record_health(ReplicaLink& link, bool ok);
  // Authorization: Bearer replica_api_key, when one is configured.
  void add_replica_auth(http::Request& req) const;

  // tracing.cpp: ends `span` now and hands it to the OTLP exporter (nothing without --otlp-endpoint).
  void end_span(trace::Span& span);
  // route() inside a router.route span under `parent` (ended here) that names the decision.
  std::shared_ptr<ReplicaLink> traced_route(const trace::Span& parent, RoutePlan& plan,
                                            const std::vector<ReplicaId>& exclude, CircuitBreaker::Ticket& ticket,
                                            int attempt);
  // A router.upstream span for one try at `link`; end_upstream_span() records how the try ended: the
  // replica's status (0: none came), and the span's status by OTel's rule for HTTP clients (an error on
  // a failure or a status of 400 and above).
  static trace::Span upstream_span(const trace::Span& parent, const ReplicaLink& link, int attempt);
  void end_upstream_span(trace::Span& span, Outcome outcome, bool failed, int status);
  // Ends the router.request span with the status the client got (0: none; `threw`: the handler failed,
  // which the server answers with 500 when nothing was sent yet), an error by OTel's rule for HTTP servers
  // (5xx, or a failure).
  void end_request_span(trace::Span& span, int status, bool threw);
  // The client's answer began (200) but ended in an error event: the request span's status is error.
  static void mark_broken(trace::Span& request_span);

  static Tick now_tick();
  // `link`: not after its removal (which dropped its series), so a request that ends then cannot re-create one.
  void count_request(const std::string& replica, const std::string& status, const ReplicaLink* link = nullptr);
  // A 503/429 retried on another replica (kvfleet_router_upstream_overloaded_total), by the same rule.
  void count_overloaded(const ReplicaLink& link, int status);
  void count_series(const char* family, const char* help, const std::string& replica, const std::string& status,
                    const ReplicaLink* link);
  // The dashboard's recent errors: failed or refused requests and replicas going down or coming back.
  void note_event(const std::string& replica, std::string what);
  awaitable<void> read_max_model_len(ReplicaLink& link);
  // True when the request may use the API (no keys configured, or a configured Bearer key).
  bool authorized(const http::Request& req) const;
  // The admin API's check; false with the status (401/403) and message to answer.
  bool admin_authorized(const http::Request& req, int& status, std::string& why) const;
  std::shared_ptr<Policy> policy() const;  // a snapshot: SIGHUP may swap policy_ at any time
  void forget_metrics(const ReplicaLink& link);  // a removed replica's labelled series

  RouterConfig config_;
  std::string name_;
  Tokenizer tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  bool template_renders_tools_ = false;
  std::unique_ptr<tools::ToolParser> tool_parser_;  // the replicas' --tool-call-parser (prompt side only)
  std::int64_t created_ = 0;
  http::MetricsRegistry metrics_;
  // Replica health checks run here, on a thread of their own (ReplicaLink::health_strand).
  boost::asio::io_context health_ioc_{1};
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> health_work_;
  std::thread health_thread_;
  std::unique_ptr<trace::SpanExporter> spans_;  // null without otlp_endpoint
  std::unique_ptr<http::HttpServer> server_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int> loops_{0};  // background coroutines running (replica loops, maintenance)
  std::optional<boost::asio::steady_timer> maintenance_timer_;  // on the server's executor

  mutable std::mutex mutex_;  // guards everything below
  ReplicaCacheIndex index_;
  std::shared_ptr<Policy> policy_;  // replaced whole by reload(); read only through a copy taken under the lock
  std::vector<std::shared_ptr<ReplicaLink>> links_;
  std::size_t active_ = 0;  // requests being forwarded
  FairQueue<std::shared_ptr<SlotWaiter>> waiting_room_;  // requests waiting for a slot
  struct TenantFlow {
    std::size_t in_flight = 0;
    double last_seen = 0;  // seconds_now() of its last request
  };
  std::unordered_map<std::string, TenantFlow> tenant_flows_;
  double grant_rate_ = 0, last_grant_ = 0;                // grants to waiters per second (decaying), for Retry-After
  std::vector<std::string> api_keys_;
  std::string admin_api_key_;

  std::unique_ptr<Discovery> discovery_;  // null without discovery.dns
  ResponseOwners response_owners_{config_.responses_affinity_entries};  // thread-safe on its own

  std::mutex series_mutex_;
  // (replica, status, family, help) of the {replica, status} counters made so far: a removal deletes them all.
  std::set<std::tuple<std::string, std::string, std::string, std::string>> request_series_;
  std::set<std::string> tenant_labels_;  // tenants with their own metric series (bounded; the rest are "other")

  struct RecentEvent {
    std::int64_t time_ms;  // Unix time
    std::string replica, what;
  };
  std::mutex events_mutex_;
  std::deque<RecentEvent> recent_events_;  // the last kRecentEvents, oldest first
  static constexpr std::size_t kRecentEvents = 50;
};

}  // namespace kvfleet::router
