#include "router/gateway/router_config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <stdexcept>

#include "kvfleet/files.h"
#include "kvfleet/trace/exporter.h"
#include "kvfleet/yaml_settings.h"
#include "router/policies/cache_aware.h"
#include "router/policy.h"

namespace kvfleet::router {
namespace {

using settings::bad;
using settings::positive;
using settings::scalar;

void check(const RouterConfig& c, const std::string& source) {
  const std::pair<const char*, const std::vector<std::string>*> lists[] = {
      {"replicas", &c.replicas}, {"prefill_replicas", &c.prefill_replicas}, {"decode_replicas", &c.decode_replicas}};
  for (const auto& [key, urls] : lists) {
    for (const auto& url : *urls) {
      try {
        parse_replica_url(url);
      } catch (const std::invalid_argument& e) {
        bad(source, key, e.what());
      }
    }
  }
  if (!c.discovery.dns.empty()) {
    try {
      parse_discovery_target(c.discovery.dns);
    } catch (const std::invalid_argument& e) {
      bad(source, "discovery.dns", e.what());
    }
  }
  if (!c.decode_replicas.empty() && c.prefill_replicas.empty() && c.replicas.empty())
    bad(source, "decode_replicas", "need prefill_replicas (or mixed replicas) beside them");
  try {
    make_policy(c.policy);  // fails at start on an unknown policy or knob, naming it
  } catch (const std::invalid_argument& e) {
    bad(source, "policy", e.what());
  }
}

CircuitBreakerConfig circuit_breaker_yaml(const YAML::Node& node, const std::string& source, CircuitBreakerConfig c) {
  if (!node.IsMap()) bad(source, "circuit_breaker", "must be a mapping {consecutive_failures, open_ms, half_open_probes}");
  for (const auto& kv : node) {
    const std::string key = "circuit_breaker." + kv.first.as<std::string>();
    if (key == "circuit_breaker.consecutive_failures") {
      c.consecutive_failures = scalar<int>(kv.second, source, key);
      if (c.consecutive_failures < 0) bad(source, key, "must be 0 (off) or more");
    } else if (key == "circuit_breaker.open_ms") c.open_duration = positive<Tick>(kv.second, source, key);
    else if (key == "circuit_breaker.half_open_probes") c.half_open_probes = positive<int>(kv.second, source, key);
    else bad(source, key, "is not a known setting");
  }
  return c;
}

RouterConfig::Discovery discovery_yaml(const YAML::Node& node, const std::string& source, RouterConfig::Discovery d) {
  if (!node.IsMap()) bad(source, "discovery", "must be a mapping {dns, interval_ms, hosts_file}");
  for (const auto& kv : node) {
    const std::string key = "discovery." + kv.first.as<std::string>();
    if (key == "discovery.dns") d.dns = scalar<std::string>(kv.second, source, key);
    else if (key == "discovery.interval_ms") d.interval = milliseconds(positive<std::int64_t>(kv.second, source, key));
    else if (key == "discovery.hosts_file") d.hosts_file = scalar<std::string>(kv.second, source, key);
    else bad(source, key, "is not a known setting");
  }
  return d;
}

// --cache-threshold 0.7 and the like: cache_aware's knobs as flags, written into the policy node.
void apply_knob_flags(RouterConfig& c, const std::vector<std::pair<std::string, std::string>>& knobs,
                      const std::string& where) {
  if (knobs.empty()) return;
  YAML::Node policy = c.policy.IsScalar() ? YAML::Node(YAML::NodeType::Map) : YAML::Clone(c.policy);
  if (c.policy.IsScalar()) policy["name"] = c.policy.Scalar();
  const std::string name = policy["name"] ? policy["name"].as<std::string>() : "";
  if (name != "cache_aware")
    bad(where, "--" + knobs.front().first, "is a cache_aware knob, but the policy is '" + name + "'");
  for (const auto& [key, value] : knobs) policy[key] = value;
  c.policy = policy;
}

}  // namespace

ReplicaAddress parse_discovery_target(const std::string& target) {
  try {
    return parse_replica_url("http://" + target);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("discovery target '" + target + "' must be NAME:PORT");
  }
}

ReplicaAddress parse_replica_url(const std::string& url) {
  const std::string scheme = "http://";
  auto fail = [&](const std::string& why) -> std::invalid_argument {
    return std::invalid_argument("replica URL '" + url + "' " + why);
  };
  if (url.rfind(scheme, 0) != 0) throw fail("must start with http://");
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find_first_of("/?#@ \t\r\n") != std::string::npos) throw fail("must be http://host:port (no path, query or user)");
  ReplicaAddress a;
  std::string port;
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':') throw fail("needs [ipv6]:port");
    a.host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
    if (a.host.empty() || a.host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos) throw fail("has a bad IPv6 host");
  } else {
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0) throw fail("needs host:port");
    a.host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    const bool name_ok = a.host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") ==
                             std::string::npos &&
                         a.host.front() != '-' && a.host.front() != '.' && a.host.size() <= 253;
    if (!name_ok) throw fail("has a bad host");
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) throw fail("has a bad port");
  const int number = std::stoi(port);
  if (number <= 0 || number > 65535) throw fail("has a bad port");
  a.port = static_cast<std::uint16_t>(number);
  return a;
}

void apply_router_yaml(const std::string& text, const std::string& source, RouterConfig& c) {
  const YAML::Node root = settings::load_mapping(text, source);
  if (root.IsNull()) return;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    auto ms = [&] { return milliseconds(positive<std::int64_t>(v, source, key)); };
    if (key == "model") c.model = scalar<std::string>(v, source, key);
    else if (key == "served_model_name") c.served_model_name = scalar<std::string>(v, source, key);
    else if (key == "host") c.host = scalar<std::string>(v, source, key);
    else if (key == "port") c.port = scalar<std::uint16_t>(v, source, key);
    else if (key == "http_threads") c.http_threads = positive<int>(v, source, key);
    else if (key == "replicas") {
      if (!v.IsSequence()) bad(source, key, "must be a list of URLs");
      c.replicas.clear();
      for (const auto& r : v) c.replicas.push_back(scalar<std::string>(r, source, key));
    } else if (key == "prefill_replicas" || key == "decode_replicas") {
      if (!v.IsSequence()) bad(source, key, "must be a list of URLs");
      auto& list = key == "prefill_replicas" ? c.prefill_replicas : c.decode_replicas;
      list.clear();
      for (const auto& r : v) list.push_back(scalar<std::string>(r, source, key));
    } else if (key == "pd_threshold") c.pd_threshold = scalar<std::uint64_t>(v, source, key);
    else if (key == "policy") c.policy = YAML::Clone(v);
    else if (key == "block_size") c.block_size = positive<std::uint64_t>(v, source, key);
    else if (key == "kv_events") c.kv_events = scalar<bool>(v, source, key);
    else if (key == "approximate_ttl_ms") c.approximate_ttl = ms();
    else if (key == "pending_ttl_ms") c.pending_ttl = ms();
    else if (key == "discovery") c.discovery = discovery_yaml(v, source, c.discovery);
    else if (key == "tree_max_bytes") c.tree_max_bytes = scalar<std::uint64_t>(v, source, key);
    else if (key == "tier_index_max_blocks") c.tier_index_max_blocks = scalar<std::uint64_t>(v, source, key);
    else if (key == "health_interval_ms") c.health_interval = ms();
    else if (key == "health_timeout_ms") c.health_timeout = ms();
    else if (key == "unhealthy_after") c.unhealthy_after = positive<int>(v, source, key);
    else if (key == "healthy_after") c.healthy_after = positive<int>(v, source, key);
    else if (key == "max_attempts") c.max_attempts = positive<int>(v, source, key);
    else if (key == "responses_affinity_entries") c.responses_affinity_entries = scalar<std::size_t>(v, source, key);
    else if (key == "session_header") c.session_header = scalar<std::string>(v, source, key);
    else if (key == "session_from_user") c.session_from_user = scalar<bool>(v, source, key);
    else if (key == "retry_backoff_ms") c.retry_backoff = ms();
    else if (key == "connect_timeout_ms") c.connect_timeout = ms();
    else if (key == "upstream_timeout_ms") c.upstream_timeout = ms();
    else if (key == "failover") c.failover = scalar<bool>(v, source, key);
    else if (key == "failover_max_attempts") c.failover_max_attempts = positive<int>(v, source, key);
    else if (key == "stream_stall_timeout_ms") c.stream_stall_timeout = ms();
    else if (key == "client_write_timeout_ms") c.client_write_timeout = ms();
    else if (key == "kv_events_timeout_ms") c.kv_events_timeout = ms();
    else if (key == "admin_api_key") c.admin_api_key = scalar<std::string>(v, source, key);
    else if (key == "replica_api_key") c.replica_api_key = scalar<std::string>(v, source, key);
    else if (key == "forward_authorization") c.forward_authorization = scalar<bool>(v, source, key);
    else if (key == "otlp_endpoint") c.otlp_endpoint = scalar<std::string>(v, source, key);
    else if (key == "upstream_keepalive") c.upstream_keepalive = scalar<std::size_t>(v, source, key);
    else if (key == "upstream_idle_timeout_ms") c.upstream_idle_timeout = ms();
    else if (key == "circuit_breaker") c.circuit_breaker = circuit_breaker_yaml(v, source, c.circuit_breaker);
    else if (key == "max_concurrency") c.max_concurrency = positive<std::size_t>(v, source, key);
    else if (key == "max_queue") c.max_queue = scalar<std::size_t>(v, source, key);
    else if (key == "queue_timeout_ms") c.queue_timeout = ms();
    else if (key == "tenant_idle_ms") c.tenant_idle = ms();
    else if (key == "tenant_weights") {
      if (!v.IsMap()) bad(source, key, "must be a map of tenant name to weight");
      c.tenant_weights.clear();
      for (const auto& kv : v) {
        const auto w = scalar<double>(kv.second, source, key);
        if (!(w > 0) || w > 1e6) bad(source, key, "weights must be in (0, 1e6]");
        c.tenant_weights[kv.first.as<std::string>()] = w;
      }
    }
    else if (key == "max_body_bytes") c.max_body_bytes = positive<std::size_t>(v, source, key);
    else if (key == "read_timeout_ms") c.read_timeout = ms();
    else if (key == "header_timeout_ms") c.header_timeout = ms();
    else if (key == "max_connections_per_peer") c.max_connections_per_peer = scalar<std::size_t>(v, source, key);
    else if (key == "drain_timeout_ms") c.drain_timeout = ms();
    else if (key == "special_tokens_in_content") c.special_tokens_in_content = scalar<bool>(v, source, key);
    else if (key == "tool_call_parser") c.tool_call_parser = scalar<std::string>(v, source, key);
    else if (key == "api_keys") {
      if (!v.IsSequence()) bad(source, key, "must be a list of strings");
      c.api_keys.clear();
      for (const auto& k : v) c.api_keys.push_back(scalar<std::string>(k, source, key));
    } else bad(source, key, "is not a known setting");
  }
}

RouterConfig parse_router_args(int argc, const char* const* argv, std::string* help) {
  RouterConfig c;
  std::string config_file;
  {
    // Flags are parsed twice: first to find --config, then again over the YAML's values so flags win.
    CLI::App pre{"kvfleet-router"};
    pre.add_option("--config", config_file);
    pre.allow_extras();
    try {
      pre.parse(argc, argv);
    } catch (const CLI::ParseError&) {
    }
  }
  if (!config_file.empty()) apply_router_yaml(read_text_file(config_file), config_file, c);

  CLI::App flags{"kvfleet-router: a prefix-aware OpenAI gateway in front of kvfleet replicas"};
  std::vector<std::string> replicas, api_keys, prefill_replicas, decode_replicas;
  std::string policy;
  std::int64_t health_ms = c.health_interval.count(), health_timeout_ms = c.health_timeout.count();
  std::int64_t drain_ms = c.drain_timeout.count();
  flags.add_option("--config", config_file, "YAML file of settings (flags win)");
  flags.add_option("--model", c.model, "Model directory (tokenizer, chat template, model id)");
  flags.add_option("--served-model-name", c.served_model_name, "Model id / hash namespace (default: directory name)");
  flags.add_option("--host", c.host, "Address to listen on");
  flags.add_option("--port", c.port, "Port (0: any free port, printed at start)");
  flags.add_option("--http-threads", c.http_threads, "HTTP io threads")->check(CLI::PositiveNumber);
  flags.add_option("--replica", replicas, "Replica base URL (repeat); replaces the YAML list");
  flags.add_option("--prefill-replica", prefill_replicas, "pd mode: prefill replica URL (repeat)");
  flags.add_option("--decode-replica", decode_replicas, "pd mode: decode replica URL (repeat)");
  flags.add_option("--pd-threshold", c.pd_threshold, "pd mode: uncached prompt tokens on D beyond which P prefills");
  flags.add_option("--policy", policy, "cache_aware, round_robin, least_load, power_of_two, consistent_hash, random");
  flags.add_option("--block-size", c.block_size, "Tokens per KV block")->check(CLI::PositiveNumber);
  flags.add_option("--kv-events", c.kv_events, "Subscribe to replicas' KV events (true/false)");
  flags.add_option("--health-interval-ms", health_ms, "Active health check period")->check(CLI::PositiveNumber);
  flags.add_option("--health-timeout-ms", health_timeout_ms, "Deadline of one health check")->check(CLI::PositiveNumber);
  flags.add_option("--max-attempts", c.max_attempts, "Tries per request (retries before any response byte)")
      ->check(CLI::PositiveNumber);
  flags.add_option("--failover", c.failover, "Resume a stream that breaks mid-way on another replica (true/false)");
  flags.add_option("--failover-max-attempts", c.failover_max_attempts, "Resumes per broken stream")
      ->check(CLI::PositiveNumber);
  std::int64_t stall_ms = c.stream_stall_timeout.count();
  flags.add_option("--stream-stall-timeout-ms", stall_ms, "A stream silent this long counts as broken")
      ->check(CLI::PositiveNumber);
  flags.add_option("--responses-affinity-entries", c.responses_affinity_entries,
                   "Stored responses whose replica the router remembers (follow-ups, GET/DELETE by id)");
  flags.add_option("--session-header", c.session_header,
                   "Request header naming a session; its requests stay on one replica (\"\": none)");
  flags.add_flag("--session-from-user,!--no-session-from-user", c.session_from_user,
                 "Take the body's `user` as the session when the header is absent (default: off)");
  flags.add_option("--max-concurrency", c.max_concurrency, "Requests forwarded at once")->check(CLI::PositiveNumber);
  flags.add_option("--max-queue", c.max_queue, "Requests waiting beyond that (then 429)");
  std::vector<std::string> tenant_weights;
  std::int64_t tenant_idle_ms = c.tenant_idle.count();
  flags.add_option("--tenant-idle-ms", tenant_idle_ms, "How long an idle tenant keeps its share of the slots");
  flags.add_option("--tenant-weight", tenant_weights, "NAME=W: the tenant's weight in flow control (repeat; default 1)");
  flags.add_option("--drain-timeout-ms", drain_ms, "On SIGTERM, how long running requests may take to finish");
  flags.add_option("--api-key", api_keys, "Require Authorization: Bearer KEY (repeat for several keys)");
  flags.add_option("--admin-api-key", c.admin_api_key, "Key of the admin API (/admin/*)");
  flags.add_option("--replica-api-key", c.replica_api_key, "Bearer key the router sends to replicas");
  flags.add_option("--forward-authorization", c.forward_authorization,
                   "Pass the client's Authorization header on to replicas (true/false)");
  flags.add_option("--otlp-endpoint", c.otlp_endpoint,
                   "Send trace spans to this OpenTelemetry collector (OTLP/HTTP JSON, http://host:port)");
  std::int64_t kv_timeout_ms = c.kv_events_timeout.count();
  flags.add_option("--kv-events-timeout-ms", kv_timeout_ms, "Reconnect a KV event stream silent this long")
      ->check(CLI::PositiveNumber);
  flags.add_flag("--special-tokens-in-content,!--no-special-tokens-in-content", c.special_tokens_in_content,
                 "Hash chat prompts as replicas run with --special-tokens-in-content do (default: off)");
  std::int64_t header_ms = c.header_timeout.count(), read_ms = c.read_timeout.count();
  std::int64_t per_peer = c.max_connections_per_peer ? std::int64_t(*c.max_connections_per_peer) : -1;
  flags.add_option("--header-timeout-ms", header_ms, "Deadline of a request's line and headers")
      ->check(CLI::PositiveNumber);
  flags.add_option("--read-timeout-ms", read_ms, "Deadline of a request's body, and of keep-alive idle time")
      ->check(CLI::PositiveNumber);
  flags.add_option("--max-connections-per-peer", per_peer,
                   "Client connections one address may hold (default: half of all; 0: no cap)")
      ->check(CLI::NonNegativeNumber);
  flags.add_option("--tool-call-parser", c.tool_call_parser,
                   "The replicas' --tool-call-parser, so that chat prompts with tools hash as theirs do");
  std::int64_t pending_ms = c.pending_ttl.count(), discovery_ms = c.discovery.interval.count();
  flags.add_option("--pending-ttl-ms", pending_ms, "Exact mode: how long a routed prefix's pending mark waits for its event")
      ->check(CLI::PositiveNumber);
  flags.add_option("--discovery-dns", c.discovery.dns, "NAME:PORT resolved periodically to the replica set");
  flags.add_option("--discovery-interval-ms", discovery_ms, "How often --discovery-dns is resolved")
      ->check(CLI::PositiveNumber);
  flags.add_option("--discovery-hosts-file", c.discovery.hosts_file, "Resolve the discovery name from this hosts file");
  // cache_aware's knobs (router/policies/cache_aware.h), e.g. --cache-threshold 0.7.
  std::vector<std::pair<std::string, std::string>> knob_flags;
  std::vector<std::string> knob_values(std::size(kCacheAwareKnobs));
  for (std::size_t i = 0; i < std::size(kCacheAwareKnobs); ++i) {
    std::string flag = std::string("--") + kCacheAwareKnobs[i];
    std::replace(flag.begin(), flag.end(), '_', '-');
    flags.add_option(flag, knob_values[i], std::string("cache_aware knob ") + kCacheAwareKnobs[i]);
  }
  try {
    flags.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (help) *help = flags.help();
    return c;
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(std::string(e.what()));
  }
  if (!replicas.empty()) c.replicas = replicas;
  if (!prefill_replicas.empty()) c.prefill_replicas = prefill_replicas;
  if (!decode_replicas.empty()) c.decode_replicas = decode_replicas;
  if (!api_keys.empty()) c.api_keys = api_keys;
  for (const std::string& tw : tenant_weights) {
    const auto eq = tw.rfind('=');
    double w = 0;
    try {
      if (eq != std::string::npos && eq > 0) w = std::stod(tw.substr(eq + 1));
    } catch (const std::exception&) {
    }
    if (!(w > 0) || w > 1e6)
      throw std::invalid_argument("--tenant-weight " + tw + ": expected NAME=W with W in (0, 1e6], e.g. acme=2");
    c.tenant_weights[tw.substr(0, eq)] = w;
  }
  if (!policy.empty()) c.policy = YAML::Node(policy);
  c.health_interval = milliseconds(health_ms);
  c.health_timeout = milliseconds(health_timeout_ms);
  c.drain_timeout = milliseconds(drain_ms);
  c.kv_events_timeout = milliseconds(kv_timeout_ms);
  c.pending_ttl = milliseconds(pending_ms);
  c.stream_stall_timeout = milliseconds(stall_ms);
  c.tenant_idle = milliseconds(tenant_idle_ms);
  c.header_timeout = milliseconds(header_ms);
  c.read_timeout = milliseconds(read_ms);
  if (per_peer >= 0) c.max_connections_per_peer = static_cast<std::size_t>(per_peer);
  c.discovery.interval = milliseconds(discovery_ms);
  const std::string where = config_file.empty() ? "flags" : config_file;
  for (std::size_t i = 0; i < knob_values.size(); ++i)
    if (!knob_values[i].empty()) knob_flags.emplace_back(kCacheAwareKnobs[i], knob_values[i]);
  apply_knob_flags(c, knob_flags, where);
  if (c.model.empty()) throw std::invalid_argument(where + ": 'model' is required (--model DIR)");
  if (!c.otlp_endpoint.empty()) trace::parse_otlp_endpoint(c.otlp_endpoint);  // throws naming what is wrong
  check(c, where);
  return c;
}

}  // namespace kvfleet::router
