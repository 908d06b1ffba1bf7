// kvfleet-router's settings: a YAML file (--config) and flags for the common ones; flags win.
// Unknown keys and bad values fail at start with a message naming the key (as the replica's config).
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/circuit_breaker.h"

namespace kvfleet::router {

using std::chrono::milliseconds;

struct RouterConfig {
  std::string model;              // model directory: tokenizer, chat template, model id (required)
  std::string served_model_name;  // default: the directory's base name (the block hash namespace)
  std::string host = "127.0.0.1";
  std::uint16_t port = 8080;
  int http_threads = 2;
  std::vector<std::string> replicas;  // base URLs, http://HOST:PORT
  // pd mode (router/gateway/pd_routing.h), on when prefill_replicas or decode_replicas is not empty:
  // `replicas` are mixed and serve in both pools.
  std::vector<std::string> prefill_replicas, decode_replicas;
  std::uint64_t pd_threshold = 0;  // tokens D lacks beyond which a prefill replica computes the prompt
  YAML::Node policy{"cache_aware"};   // a name, or {name: ..., knobs...} (make_policy)
  std::uint64_t block_size = 16;      // must match the replicas' (checked against KV event config)
  bool kv_events = true;              // subscribe to /v1/kv_events (exact mode)
  milliseconds approximate_ttl{120'000};
  // Exact mode: how long a routing decision's mark on blocks the replica does not hold yet waits for
  // the stored event that confirms it (router/replica_cache_index.h).
  milliseconds pending_ttl{20'000};
  std::uint64_t tree_max_bytes = 256ull << 20;
  std::uint64_t tier_index_max_blocks = 1ull << 20;  // blocks of the replicas' lower KV tiers the router keeps
  // Active health checks: GET /health every interval; this many failures in a row -> unhealthy,
  // this many successes in a row -> healthy again. A failed connect marks unhealthy at once.
  milliseconds health_interval{1'000};
  milliseconds health_timeout{1'000};
  int unhealthy_after = 2;
  int healthy_after = 2;
  // Retries happen only while nothing has reached the client yet.
  int max_attempts = 3;
  milliseconds retry_backoff{20};        // doubled per retry, with jitter up to the same again
  milliseconds connect_timeout{1'000};   // per try
  milliseconds upstream_timeout{300'000};  // each upstream read/write (first token included)
  // Mid-stream failover (docs/router.md): a streamed request (one choice) whose replica dies, or sends
  // nothing for stream_stall_timeout once its stream has begun, is resumed exactly on another replica,
  // at most failover_max_attempts times. Off: such a stream ends with an error event.
  bool failover = true;
  int failover_max_attempts = 2;
  milliseconds stream_stall_timeout{10'000};
  // Each write to the client. Kept apart from upstream_timeout: a client that reads slowly is cut off
  // on its own deadline, and a replica stream that breaks while the client stalls is not the
  // replica's fault (its circuit breaker does not count it).
  milliseconds client_write_timeout{30'000};
  // KV event streams: the replica sends `: ping` every few seconds (3 s by default); hearing nothing
  // for this long, the router reconnects.
  milliseconds kv_events_timeout{10'000};
  // Upstream keep-alive: idle connections kept per replica (0: a new connection per request), each
  // closed after this idle time (keep it below the replicas' read_timeout, 30 s by default).
  std::size_t upstream_keepalive = 64;
  milliseconds upstream_idle_timeout{20'000};
  // Passive outlier ejection per replica (router.yaml `circuit_breaker:` {consecutive_failures,
  // open_ms, half_open_probes}); see router/circuit_breaker.h.
  CircuitBreakerConfig circuit_breaker;
  // Overload: at most max_concurrency requests are forwarded at once, up to max_queue more wait
  // (each at most queue_timeout); beyond that, 429.
  std::size_t max_concurrency = 1024;
  std::size_t max_queue = 4096;
  milliseconds queue_timeout{30'000};
  // Flow control: waiting requests are served by priority band (the body's `priority`, or the
  // x-kvfleet-priority header; lower first), and within a band tenants share slots and room by weight
  // (1 unless named here). The tenant is the API key (`key-1` for the first of api_keys) when keys are
  // configured, else the x-kvfleet-tenant header, else `default`. See router/flow/fair_queue.h.
  std::unordered_map<std::string, double> tenant_weights;
  // A tenant with nothing in flight or waiting keeps its share of the slots this long after its last request.
  milliseconds tenant_idle{5'000};
  std::size_t max_body_bytes = 8 << 20;
  // Stored responses (/v1/responses) whose replica the router remembers, for follow-ups and GET/DELETE
  // by id (router/gateway/response_owners.h); one it forgot is looked for by asking the replicas.
  std::size_t responses_affinity_entries = 100'000;
  // Session affinity: a request's session key is this header's value, else (with session_from_user) the
  // body's `user` field. cache_aware places a session's uncached prompt on the replica its key hashes
  // to, so a conversation's turns stay on one replica (router/policies/cache_aware.h). Empty header and
  // session_from_user false: no session keys (consistent_hash reads its own `header` knob either way).
  std::string session_header = "x-session-id";
  bool session_from_user = false;
  milliseconds read_timeout{30'000};  // a request's body, and keep-alive idle time between requests
  // A request's line and headers (shorter than read_timeout: a slowloris holds a slot this long at most).
  milliseconds header_timeout{10'000};
  // Client connections are capped at max_concurrency + max_queue + 64; one client address may hold at most
  // this many of them (unset: half; 0: no cap). Past a cap the oldest idle half-request is closed, and
  // /health, /readiness, /liveness, /metrics and /admin/* still answer (engine/include/kvfleet/http/server.h).
  std::optional<std::size_t> max_connections_per_peer;
  milliseconds drain_timeout{30'000};
  // Non-empty: the OpenAI endpoints require `Authorization: Bearer <one of these>` (401 otherwise).
  std::vector<std::string> api_keys;
  // The admin API (/admin/*) needs `Authorization: Bearer <admin_api_key>`. Without one it is served
  // only when the router listens on a loopback host and no api_keys are set (a local, open setup);
  // otherwise it answers 403.
  std::string admin_api_key;
  // Sent as `Authorization: Bearer KEY` to replicas: the KV event stream, health checks, and forwarded
  // requests (in place of the client's Authorization, which is not forwarded unless
  // forward_authorization is true).
  std::string replica_api_key;
  bool forward_authorization = false;
  // Non-empty: trace spans go to this OpenTelemetry collector over OTLP/HTTP JSON
  // (http://host:port; kvfleet/trace/exporter.h).
  std::string otlp_endpoint;
  // Must match the replicas' special_tokens_in_content, so that chat prompts hash the same (Contract 1).
  bool special_tokens_in_content = false;
  // Must match the replicas' --tool-call-parser: a chat template without a tools section gets that
  // parser's tool instructions, in the replica and so in the router's hashes (kvfleet/chat_tools.h).
  std::string tool_call_parser;
  // Replica discovery (router/gateway/discovery.h): `dns` is NAME:PORT, resolved every `interval` to
  // the set of replica addresses (a Kubernetes headless Service, Consul DNS, /etc/hosts); added
  // addresses are subscribed, vanished ones removed. `hosts_file`: resolve NAME from this file (hosts
  // format, re-read each time) instead of the system resolver. Empty dns = off.
  struct Discovery {
    std::string dns{};
    milliseconds interval{5'000};
    std::string hosts_file{};
  } discovery;
};

// Parses argv (and the YAML file it names); throws std::invalid_argument naming the bad key or
// flag. `help` gets the usage text when --help was asked.
RouterConfig parse_router_args(int argc, const char* const* argv, std::string* help);
// Applies a YAML document to `config` (exposed for tests).
void apply_router_yaml(const std::string& yaml_text, const std::string& source, RouterConfig& config);

struct ReplicaAddress {
  std::string host;  // without brackets for IPv6
  std::uint16_t port = 0;
};
// "http://host:port[/]" -> {host, port}; throws std::invalid_argument otherwise. The host is a DNS
// name or IPv4 address (letters, digits, '-', '.') or a bracketed IPv6 address; the port 1-65535.
// No user info, path, query or fragment.
ReplicaAddress parse_replica_url(const std::string& url);
// "NAME:PORT" of discovery.dns -> {NAME, PORT}; throws std::invalid_argument otherwise.
ReplicaAddress parse_discovery_target(const std::string& target);

}  // namespace kvfleet::router
