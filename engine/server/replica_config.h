// kvfleet-replica's settings: a YAML file (--config) and a flag for every setting; flags win.
// Unknown keys and bad values fail at start with a message naming the key.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/pd/pd_config.h"
#include "kvfleet/communicator.h"
#include "kvfleet/engine.h"
#include "kvfleet/request_defaults.h"

namespace kvfleet::server {

struct ReplicaConfig {
  std::string model;               // Hugging Face model directory (required)
  std::string served_model_name;   // default: the directory's base name
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;
  std::string role = "mixed";      // mixed | prefill | decode (Contract 3)
  int http_threads = 2;
  EngineConfig engine;             // backend, blocks, batching, chunked prefill, prefix caching
  std::size_t max_body_bytes = 8 << 20;
  std::size_t max_header_bytes = 16 << 10;
  std::chrono::milliseconds read_timeout{30'000};    // a request's body, and keep-alive idle time
  std::chrono::milliseconds header_timeout{10'000};  // a request's line and headers
  // Connections in all, and per client address (unset: half of max_connections; 0: no cap). Past a cap the
  // oldest idle half-request is closed, and /health and /metrics still answer
  // (engine/include/kvfleet/http/server.h).
  std::size_t max_connections = 4096;
  std::optional<std::size_t> max_connections_per_peer;
  std::chrono::milliseconds drain_timeout{30'000};
  std::chrono::milliseconds kv_events_heartbeat{3'000};  // `: ping` on an idle /v1/kv_events stream
  std::size_t max_waiting_requests = 1024;  // more in the queue -> 429
  std::int32_t default_max_tokens = kDefaultMaxTokens;  // completions without max_tokens
  // Bearer keys. api_key protects /v1/*, /tokenize and /detokenize; internal_api_key, when set, is the only
  // key /v1/kv_events and /internal/* accept (unset: they follow api_key). /health and /metrics stay open.
  std::string api_key, internal_api_key;
  // With neither key, /v1/kv_events and /internal/* answer only clients on a loopback address (403 for
  // others) unless this is set: for a network where every client is trusted.
  bool open_internal_endpoints = false;
  // Non-empty: trace spans go to this OpenTelemetry collector over OTLP/HTTP JSON
  // (http://host:port; kvfleet/trace/exporter.h).
  std::string otlp_endpoint;
  // false: special-token text inside message content is tokenized as plain text (only the chat
  // template's own special tokens are special), so a user cannot close its turn and open another.
  // true: such text becomes the special token, as vLLM does. Routers must be given the same value.
  bool special_tokens_in_content = false;
  // Tool calling and reasoning (vLLM's flags): the format chat answers' tool calls are parsed in
  // (kvfleet/tool_parser.h; empty: none), whether tool_choice "auto" is served (it needs a parser), and the
  // format of reasoning (kvfleet/reasoning_parser.h; empty: none).
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;
  std::string reasoning_parser;
  // POST /v1/responses with store: the in-memory store's bounds (least recently used evicted first).
  std::size_t responses_store_entries = 10000;
  std::size_t responses_store_bytes = std::size_t{256} << 20;
  pd::PdConfig pd;                          // KV transfer between prefill and decode replicas (Contract 3)
  int ep_size = 1;  // MoE: expert-parallel ranks behind this endpoint (kvfleet/ep_group.h)
  // One rank per process (Gloo): this process is rank ep_rank (-1: all ranks in this process). Rank 0
  // serves HTTP; ranks > 0 serve only rank 0 (kvfleet/ep_worker.h). ep_master: HOST:PORT of rank 0's
  // rendezvous store; ep_bind: this rank's address for the collectives and the request channel.
  int ep_rank = -1;
  std::string ep_master, ep_bind;
  std::chrono::milliseconds ep_timeout{30'000};        // a silent rank fails the group after this
  std::chrono::milliseconds ep_join_timeout{300'000};  // forming the group (ranks may start minutes apart)
  // The process ranks' collectives: gloo (CPU, over TCP; CUDA ranks stage through the host), nccl (CUDA
  // ranks, device memory) or auto (nccl for a CUDA rank in a build with NCCL). resolve_ep_comm decides.
  std::string ep_comm = "auto";
  bool ep_processes() const { return ep_rank >= 0; }
};

// The communicator options of an --ep-rank process (backend_kind from the engine's backend).
inline EpCommOptions ep_comm_options(const ReplicaConfig& c) {
  EpCommOptions o;
  o.kind = c.ep_comm;
  o.rank = c.ep_rank;
  o.size = c.ep_size;
  o.master = c.ep_master;
  o.bind_host = c.ep_bind;
  o.backend_kind = c.engine.backend.kind;
  o.timeout = c.ep_timeout;
  o.join_timeout = c.ep_join_timeout;
  return o;
}

// Parses argv (and the YAML file it names). Throws std::invalid_argument with a message naming the bad key
// or flag; `help` gets the usage text when --help was asked (then the config is not valid to use).
ReplicaConfig parse_replica_args(int argc, const char* const* argv, std::string* help);

// Applies a YAML document to `config` (exposed for tests).
void apply_replica_yaml(const std::string& yaml_text, const std::string& source, ReplicaConfig& config);

}  // namespace kvfleet::server
