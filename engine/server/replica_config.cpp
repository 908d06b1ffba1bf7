#include "engine/server/replica_config.h"

#include <yaml-cpp/yaml.h>

#include <boost/json.hpp>

#include <CLI/CLI.hpp>
#include <set>
#include <stdexcept>

#include "engine/pd/transport.h"
#include "kvfleet/files.h"
#include "kvfleet/reasoning_parser.h"
#include "kvfleet/tool_parser.h"
#include "kvfleet/trace/exporter.h"
#include "kvfleet/yaml_settings.h"

namespace kvfleet::server {
namespace {

using settings::bad;
using settings::positive;
using settings::scalar;

void check_role(const std::string& role, const std::string& where) {
  if (role != "mixed" && role != "prefill" && role != "decode") bad(where, "role", "must be mixed, prefill or decode");
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::int64_t gib_bytes(double gib, const char* name) {
  if (!(gib >= 0.0) || gib > 1e6) throw std::invalid_argument(std::string(name) + ": must be a number of GiB, 0 or more");
  return static_cast<std::int64_t>(gib * kGiB);
}

void check_kv_tiers(const ReplicaConfig& c) {
  const KvTierConfig& t = c.engine.kv_tiers;
  if (!t.disk_dir.empty() && t.disk_bytes <= 0)
    throw std::invalid_argument("kv_disk_gib: --kv-disk-dir needs --kv-disk-gib, the disk tier's size (more than 0)");
  if (t.disk_dir.empty() && t.disk_bytes > 0) throw std::invalid_argument("kv_disk_gib: needs --kv-disk-dir");
  if (!t.enabled()) return;
  if (!c.engine.enable_prefix_caching)
    throw std::invalid_argument("kv_host_gib: KV cache tiers need prefix caching (--enable-prefix-caching true)");
  if (c.ep_size > 1) throw std::invalid_argument("kv_host_gib: KV cache tiers are not supported with --ep-size > 1");
}

void check_ep(const ReplicaConfig& c) {
  if (c.ep_size > 1 && c.engine.speculative.enabled())
    throw std::invalid_argument("speculative_config: speculative decoding is not supported with --ep-size > 1");
  if (c.ep_processes() && c.ep_master.empty()) throw std::invalid_argument("--ep-rank needs --ep-master HOST:PORT");
  if (!c.ep_processes() && !c.ep_master.empty()) throw std::invalid_argument("--ep-master needs --ep-rank");
  if (c.ep_processes() && c.ep_rank >= c.ep_size)
    throw std::invalid_argument("--ep-rank " + std::to_string(c.ep_rank) + " must be below --ep-size " + std::to_string(c.ep_size));
  if (c.ep_comm != "auto" && !c.ep_processes())
    throw std::invalid_argument("--ep-comm needs --ep-rank (in-process ranks exchange through memory)");
  // An unknown kind or nccl on a CPU backend; a build without NCCL says so at startup (resolve_ep_comm).
  if (c.ep_processes()) check_ep_comm(ep_comm_options(c));
}

// "ucx,tcp" in order of preference; a build without UCX refuses ucx by name.
std::vector<std::string> transports_of(const std::string& list, const std::string& where, const std::string& key) {
  try {
    return pd::parse_transports(list, pd::built_transports());
  } catch (const std::invalid_argument& e) {
    if (key.empty()) throw std::invalid_argument(where + ": " + e.what());
    bad(where, key, e.what());
  }
  return {};
}

// speculative_config: vLLM's JSON as a string, or the same keys as a YAML mapping.
SpeculativeConfig speculative_of(const YAML::Node& v, const std::string& source) {
  try {
    if (v.IsScalar()) return parse_speculative_config(v.as<std::string>());
    if (!v.IsMap()) bad(source, "speculative_config", "must be a JSON string or a mapping");
    std::string json = "{";
    for (const auto& kv : v) {
      const std::string key = kv.first.as<std::string>(), value = kv.second.as<std::string>();
      if (json.size() > 1) json += ",";
      bool number = false;  // 4, 0.1, 1e-3: a JSON number; anything else a string
      if (!value.empty() && value.find_first_not_of("-+.0123456789eE") == std::string::npos) {
        boost::system::error_code ec;
        const boost::json::value parsed = boost::json::parse(value, ec);
        number = !ec && parsed.is_number();
      }
      json += boost::json::serialize(boost::json::value(key)) + ":" +
              (number ? value : boost::json::serialize(boost::json::value(value)));
    }
    return parse_speculative_config(json + "}");
  } catch (const YAML::Exception& e) {
    bad(source, "speculative_config", e.what());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(source + ": " + e.what());
  }
  return {};
}

// vLLM's --scheduling-policy: true for "priority".
bool scheduling_policy(const std::string& name, const std::string& source) {
  if (name == "fcfs") return false;
  if (name == "priority") return true;
  throw std::invalid_argument(source + ": scheduling_policy '" + name + "' is not one of fcfs, priority");
}

}  // namespace

// Names are checked where they are given; the flags' combination once all are in.
void check_parsers(const ReplicaConfig& c, const std::string& where, bool combination) {
  if (!c.tool_call_parser.empty() && !tools::make_tool_parser(c.tool_call_parser))
    throw std::invalid_argument(where + ": unknown tool call parser '" + c.tool_call_parser + "' (known: " +
                                tools::tool_parser_names() + ")");
  if (!c.reasoning_parser.empty() && !tools::make_reasoning_parser(c.reasoning_parser))
    throw std::invalid_argument(where + ": unknown reasoning parser '" + c.reasoning_parser + "' (known: " +
                                tools::reasoning_parser_names() + ")");
  if (combination && c.enable_auto_tool_choice && c.tool_call_parser.empty())
    throw std::invalid_argument(where + ": --enable-auto-tool-choice needs --tool-call-parser");
}

void apply_replica_yaml(const std::string& text, const std::string& source, ReplicaConfig& c) {
  const YAML::Node root = settings::load_mapping(text, source);
  if (root.IsNull()) return;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    auto ms = [&] { return std::chrono::milliseconds(scalar<std::int64_t>(v, source, key)); };
    if (key == "model") c.model = scalar<std::string>(v, source, key);
    else if (key == "served_model_name") c.served_model_name = scalar<std::string>(v, source, key);
    else if (key == "host") c.host = scalar<std::string>(v, source, key);
    else if (key == "port") c.port = scalar<std::uint16_t>(v, source, key);
    else if (key == "role") c.role = scalar<std::string>(v, source, key);
    else if (key == "ep_size") c.ep_size = scalar<int>(v, source, key);
    else if (key == "ep_rank") c.ep_rank = scalar<int>(v, source, key);
    else if (key == "ep_master") c.ep_master = scalar<std::string>(v, source, key);
    else if (key == "ep_bind") c.ep_bind = scalar<std::string>(v, source, key);
    else if (key == "ep_comm") c.ep_comm = scalar<std::string>(v, source, key);
    else if (key == "ep_timeout_ms") c.ep_timeout = ms();
    else if (key == "ep_join_timeout_ms") c.ep_join_timeout = ms();
    else if (key == "http_threads") c.http_threads = scalar<int>(v, source, key);
    else if (key == "backend") c.engine.backend.kind = scalar<std::string>(v, source, key);
    else if (key == "cpu_threads") c.engine.backend.threads = scalar<unsigned>(v, source, key);
    else if (key == "kv_cache_dtype") c.engine.backend.kv_cache_dtype = scalar<std::string>(v, source, key);
    else if (key == "block_size") c.engine.block_size = scalar<std::int32_t>(v, source, key);
    else if (key == "num_kv_blocks") c.engine.num_blocks = scalar<std::int32_t>(v, source, key);
    else if (key == "max_num_seqs") c.engine.scheduler.max_num_seqs = scalar<std::int32_t>(v, source, key);
    else if (key == "max_num_batched_tokens") c.engine.scheduler.max_num_batched_tokens = scalar<std::int32_t>(v, source, key);
    else if (key == "scheduling_policy") c.engine.scheduler.use_priority = scheduling_policy(scalar<std::string>(v, source, key), source);
    else if (key == "enable_chunked_prefill") c.engine.scheduler.enable_chunked_prefill = scalar<bool>(v, source, key);
    else if (key == "enable_prefix_caching") c.engine.enable_prefix_caching = scalar<bool>(v, source, key);
    else if (key == "kv_host_gib") c.engine.kv_tiers.host_bytes = gib_bytes(scalar<double>(v, source, key), "kv_host_gib");
    else if (key == "kv_disk_dir") c.engine.kv_tiers.disk_dir = scalar<std::string>(v, source, key);
    else if (key == "kv_disk_gib") c.engine.kv_tiers.disk_bytes = gib_bytes(scalar<double>(v, source, key), "kv_disk_gib");
    else if (key == "kv_shared_dir") c.engine.kv_tiers.shared_dir = scalar<std::string>(v, source, key);
    else if (key == "kv_shared_index_blocks") c.engine.kv_tiers.shared_index_blocks = positive<std::int64_t>(v, source, key);
    else if (key == "max_model_len") c.engine.max_model_len = scalar<std::int64_t>(v, source, key);
    else if (key == "speculative_config") c.engine.speculative = speculative_of(v, source);
    else if (key == "max_body_bytes") c.max_body_bytes = scalar<std::size_t>(v, source, key);
    else if (key == "max_header_bytes") c.max_header_bytes = scalar<std::size_t>(v, source, key);
    else if (key == "read_timeout_ms") c.read_timeout = ms();
    else if (key == "header_timeout_ms") c.header_timeout = ms();
    else if (key == "max_connections") c.max_connections = positive<std::size_t>(v, source, key);
    else if (key == "max_connections_per_peer") c.max_connections_per_peer = scalar<std::size_t>(v, source, key);
    else if (key == "drain_timeout_ms") c.drain_timeout = ms();
    else if (key == "kv_events_heartbeat_ms") c.kv_events_heartbeat = ms();
    else if (key == "max_waiting_requests") c.max_waiting_requests = scalar<std::size_t>(v, source, key);
    else if (key == "default_max_tokens") c.default_max_tokens = scalar<std::int32_t>(v, source, key);
    else if (key == "api_key") c.api_key = scalar<std::string>(v, source, key);
    else if (key == "internal_api_key") c.internal_api_key = scalar<std::string>(v, source, key);
    else if (key == "otlp_endpoint") c.otlp_endpoint = scalar<std::string>(v, source, key);
    else if (key == "open_internal_endpoints") c.open_internal_endpoints = scalar<bool>(v, source, key);
    else if (key == "special_tokens_in_content") c.special_tokens_in_content = scalar<bool>(v, source, key);
    else if (key == "tool_call_parser") c.tool_call_parser = scalar<std::string>(v, source, key);
    else if (key == "enable_auto_tool_choice") c.enable_auto_tool_choice = scalar<bool>(v, source, key);
    else if (key == "reasoning_parser") c.reasoning_parser = scalar<std::string>(v, source, key);
    else if (key == "responses_store_entries") c.responses_store_entries = scalar<std::size_t>(v, source, key);
    else if (key == "responses_store_bytes") c.responses_store_bytes = scalar<std::size_t>(v, source, key);
    else if (key == "pd_lease_ms") c.pd.lease = ms();
    else if (key == "pd_connect_timeout_ms") c.pd.connect_timeout = ms();
    else if (key == "pd_io_timeout_ms") c.pd.io_timeout = ms();
    else if (key == "pd_transfer_timeout_ms") c.pd.transfer_timeout = ms();
    else if (key == "pd_pull_blocks") c.pd.pull_blocks = scalar<std::uint32_t>(v, source, key);
    else if (key == "pd_transports") c.pd.transports = transports_of(scalar<std::string>(v, source, key), source, key);
    else if (key == "pd_ucx_port") c.pd.ucx_port = scalar<std::uint16_t>(v, source, key);
    else bad(source, key, "is not a known setting");
  }
  check_role(c.role, source);
  check_parsers(c, source, false);
}

ReplicaConfig parse_replica_args(int argc, const char* const* argv, std::string* help) {
  ReplicaConfig c;
  CLI::App app{"kvfleet-replica: an OpenAI-compatible server around the kvfleet engine"};
  std::string config_file;
  app.add_option("--config", config_file, "YAML file of settings (flags win)");
  // Flags are parsed twice: first to find --config, then again over the YAML's values so flags win.
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
  } catch (const CLI::ParseError&) {
  }
  if (!config_file.empty()) apply_replica_yaml(read_text_file(config_file), config_file, c);

  CLI::App flags{"kvfleet-replica: an OpenAI-compatible server around the kvfleet engine"};
  flags.add_option("--config", config_file, "YAML file of settings (flags win)");
  flags.add_option("--model", c.model, "Hugging Face model directory");
  flags.add_option("--served-model-name", c.served_model_name, "Model id in the API (default: directory name)");
  flags.add_option("--host", c.host, "Address to listen on");
  flags.add_option("--port", c.port, "Port (0: any free port, printed at start)");
  flags.add_option("--role", c.role, "mixed, prefill or decode")->check(CLI::IsMember({"mixed", "prefill", "decode"}));
  flags.add_option("--http-threads", c.http_threads, "HTTP io threads")->check(CLI::PositiveNumber);
  flags.add_option("--ep-size", c.ep_size, "MoE: expert-parallel ranks (in process, or with --ep-rank one per process; "
                                           "requests spread by cached prefix)")
      ->check(CLI::PositiveNumber);
  flags.add_option("--ep-rank", c.ep_rank, "MoE: this process is rank R of --ep-size processes (Gloo or NCCL); rank 0 serves HTTP")
      ->check(CLI::NonNegativeNumber);
  flags.add_option("--ep-master", c.ep_master, "With --ep-rank: HOST:PORT where rank 0 runs the rendezvous store");
  flags.add_option("--ep-bind", c.ep_bind, "With --ep-rank: this rank's address for the collectives and the request "
                                           "channel (default: 127.0.0.1 for a loopback master, else the host name's)");
  flags.add_option("--ep-comm", c.ep_comm, "With --ep-rank: gloo (CPU collectives over TCP), nccl (CUDA ranks, device "
                                           "memory) or auto (nccl for a CUDA rank when built with NCCL)");
  std::int64_t ep_timeout_ms = c.ep_timeout.count(), ep_join_ms = c.ep_join_timeout.count();
  flags.add_option("--ep-timeout-ms", ep_timeout_ms, "With --ep-rank: a rank silent for this long fails the group")
      ->check(CLI::PositiveNumber);
  flags.add_option("--ep-join-timeout-ms", ep_join_ms, "With --ep-rank: how long the ranks may take to form the group")
      ->check(CLI::PositiveNumber);
  flags.add_option("--backend", c.engine.backend.kind, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  flags.add_option("--cpu-threads", c.engine.backend.threads, "CPU backend threads (0: all cores)");
  flags.add_option("--kv-cache-dtype", c.engine.backend.kv_cache_dtype, "KV cache element type: auto, float32, bfloat16 or float16")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"}));
  flags.add_option("--block-size", c.engine.block_size, "Tokens per KV block")->check(CLI::PositiveNumber);
  flags.add_option("--num-kv-blocks", c.engine.num_blocks, "KV cache blocks")->check(CLI::PositiveNumber);
  flags.add_option("--max-num-seqs", c.engine.scheduler.max_num_seqs, "Sequences per step")->check(CLI::PositiveNumber);
  flags.add_option("--max-num-batched-tokens", c.engine.scheduler.max_num_batched_tokens, "Token budget per step")
      ->check(CLI::PositiveNumber);
  std::string policy;
  flags.add_option("--scheduling-policy", policy, "fcfs (default) or priority (the body's `priority`, lower first)");
  flags.add_option("--enable-chunked-prefill", c.engine.scheduler.enable_chunked_prefill, "true or false");
  flags.add_option("--enable-prefix-caching", c.engine.enable_prefix_caching, "true or false");
  double host_gib = static_cast<double>(c.engine.kv_tiers.host_bytes) / kGiB;
  double disk_gib = static_cast<double>(c.engine.kv_tiers.disk_bytes) / kGiB;
  flags.add_option("--kv-host-gib", host_gib, "KV host tier: GiB of RAM for blocks evicted from the device pool (0: none)");
  flags.add_option("--kv-disk-dir", c.engine.kv_tiers.disk_dir, "KV disk tier: this replica's directory of block files");
  flags.add_option("--kv-disk-gib", disk_gib, "KV disk tier: its size in GiB (required with --kv-disk-dir)");
  flags.add_option("--kv-shared-dir", c.engine.kv_tiers.shared_dir,
                   "KV shared tier: a directory of block files that several replicas read and write");
  flags.add_option("--kv-shared-index-blocks", c.engine.kv_tiers.shared_index_blocks,
                   "KV shared tier: blocks this replica remembers finding or writing (least recently used forgotten)")
      ->check(CLI::PositiveNumber);
  flags.add_option("--max-model-len", c.engine.max_model_len, "Context length (0: the model's)");
  std::string speculative;
  flags.add_option("--speculative-config", speculative,
                   "Speculative decoding, vLLM's JSON: {\"method\":\"ngram\",\"num_speculative_tokens\":K,"
                   "\"prompt_lookup_max\":N,\"prompt_lookup_min\":M} or {\"method\":\"suffix\",\"num_speculative_tokens\":K,"
                   "\"suffix_decoding_max_tree_depth\":D,\"suffix_decoding_max_cached_requests\":R,...}");
  flags.add_option("--max-body-bytes", c.max_body_bytes, "Largest request body (413 beyond)");
  flags.add_option("--max-header-bytes", c.max_header_bytes, "Largest request head (431 beyond)");
  std::int64_t read_ms = c.read_timeout.count(), drain_ms = c.drain_timeout.count();
  std::int64_t heartbeat_ms = c.kv_events_heartbeat.count();
  flags.add_option("--kv-events-heartbeat-ms", heartbeat_ms, "Heartbeat period of the KV event stream")
      ->check(CLI::PositiveNumber);
  flags.add_option("--read-timeout-ms", read_ms, "Deadline for reading one request");
  flags.add_option("--drain-timeout-ms", drain_ms, "On SIGTERM, how long running requests may take to finish");
  flags.add_option("--max-waiting-requests", c.max_waiting_requests, "Queued requests beyond which new ones get 429");
  flags.add_option("--default-max-tokens", c.default_max_tokens, "max_tokens of completions that give none");
  flags.add_option("--api-key", c.api_key, "Bearer key required on /v1/*, /tokenize, /detokenize");
  flags.add_option("--otlp-endpoint", c.otlp_endpoint,
                   "Send trace spans to this OpenTelemetry collector (OTLP/HTTP JSON, http://host:port)");
  flags.add_option("--internal-api-key", c.internal_api_key,
                   "The only key /v1/kv_events and /internal/* accept (default: --api-key)");
  flags.add_flag("--open-internal-endpoints", c.open_internal_endpoints,
                 "Without keys, serve /v1/kv_events and /internal/* to non-loopback clients too (trusted networks)");
  flags.add_flag("--special-tokens-in-content,!--no-special-tokens-in-content", c.special_tokens_in_content,
                 "Let special-token text in message content become special tokens (default: plain text; the "
                 "template's own specials stay)");
  std::int64_t header_ms = c.header_timeout.count();
  std::int64_t per_peer = c.max_connections_per_peer ? std::int64_t(*c.max_connections_per_peer) : -1;
  flags.add_option("--header-timeout-ms", header_ms, "Deadline of a request's line and headers")
      ->check(CLI::PositiveNumber);
  flags.add_option("--max-connections", c.max_connections, "Open connections at most")->check(CLI::PositiveNumber);
  flags.add_option("--max-connections-per-peer", per_peer,
                   "Connections one client address may hold (default: half of --max-connections; 0: no cap)")
      ->check(CLI::NonNegativeNumber);
  flags.add_option("--tool-call-parser", c.tool_call_parser,
                   "Parse chat answers' tool calls in this format: " + tools::tool_parser_names());
  flags.add_flag("--enable-auto-tool-choice", c.enable_auto_tool_choice,
                 "Serve tool_choice \"auto\" (the model decides whether to call a tool; needs --tool-call-parser)");
  flags.add_option("--reasoning-parser", c.reasoning_parser,
                   "Return <think> text as reasoning_content in this format: " + tools::reasoning_parser_names());
  flags.add_option("--responses-store-entries", c.responses_store_entries,
                   "Stored responses (/v1/responses with store) kept at most; 0 stores none");
  flags.add_option("--responses-store-bytes", c.responses_store_bytes, "Bytes of stored responses kept at most");
  std::int64_t lease_ms = c.pd.lease.count(), pd_connect_ms = c.pd.connect_timeout.count();
  std::int64_t pd_io_ms = c.pd.io_timeout.count(), pd_transfer_ms = c.pd.transfer_timeout.count();
  flags.add_option("--pd-lease-ms", lease_ms, "Prefill role: how long fetched-for blocks stay pinned without progress")
      ->check(CLI::PositiveNumber);
  flags.add_option("--pd-connect-timeout-ms", pd_connect_ms, "Decode role: connecting to a prefill replica")
      ->check(CLI::PositiveNumber);
  flags.add_option("--pd-io-timeout-ms", pd_io_ms, "Decode role: each read from a prefill replica")->check(CLI::PositiveNumber);
  flags.add_option("--pd-transfer-timeout-ms", pd_transfer_ms, "Decode role: a whole KV transfer")->check(CLI::PositiveNumber);
  flags.add_option("--pd-pull-blocks", c.pd.pull_blocks, "Decode role: KV blocks per pull")->check(CLI::PositiveNumber);
  std::string transports;
  flags.add_option("--pd-transports", transports,
                   "KV transports this replica speaks, in order of preference (ucx,tcp; default tcp)");
  flags.add_option("--pd-ucx-port", c.pd.ucx_port, "Prefill role: the UCX listener's port (0: any free port)");
  try {
    flags.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (help) *help = flags.help();
    return c;
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(std::string(e.what()));
  }
  if (!policy.empty()) c.engine.scheduler.use_priority = scheduling_policy(policy, "--scheduling-policy");
  if (!speculative.empty()) {
    try {
      c.engine.speculative = parse_speculative_config(speculative);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--speculative-config: ") + e.what());
    }
  }
  c.read_timeout = std::chrono::milliseconds(read_ms);
  c.header_timeout = std::chrono::milliseconds(header_ms);
  if (per_peer >= 0) c.max_connections_per_peer = static_cast<std::size_t>(per_peer);
  c.drain_timeout = std::chrono::milliseconds(drain_ms);
  c.kv_events_heartbeat = std::chrono::milliseconds(heartbeat_ms);
  c.pd.lease = std::chrono::milliseconds(lease_ms);
  c.pd.connect_timeout = std::chrono::milliseconds(pd_connect_ms);
  c.pd.io_timeout = std::chrono::milliseconds(pd_io_ms);
  c.pd.transfer_timeout = std::chrono::milliseconds(pd_transfer_ms);
  if (!transports.empty()) c.pd.transports = transports_of(transports, "--pd-transports", "");
  c.ep_timeout = std::chrono::milliseconds(ep_timeout_ms);
  c.ep_join_timeout = std::chrono::milliseconds(ep_join_ms);
  c.engine.kv_tiers.host_bytes = gib_bytes(host_gib, "--kv-host-gib");
  c.engine.kv_tiers.disk_bytes = gib_bytes(disk_gib, "--kv-disk-gib");
  check_ep(c);
  check_kv_tiers(c);
  check_parsers(c, "flags", true);
  if (c.model.empty()) throw std::invalid_argument("--model (or 'model' in the config file) is required");
  if (!c.otlp_endpoint.empty()) trace::parse_otlp_endpoint(c.otlp_endpoint);  // throws naming what is wrong
  return c;
}

}  // namespace kvfleet::server
