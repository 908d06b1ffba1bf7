// Routing policies: small interchangeable objects picked by config (STYLE.md 6). The router fills
// one ReplicaState per configured replica (load from its own bookkeeping, matched_blocks from the
// PrefixTree) and asks the policy for an index into that span. Policies never see HTTP.
//
// Rules every policy keeps: an unhealthy or draining replica is never chosen; with none available
// the Decision says so (ok() == false, reason "no_replica_available") instead of guessing.
//
// Thread-safety: choose() may change the policy's own state (a counter, an RNG, a hash ring), so
// one policy object must not be used by two threads at once; the router serializes calls or keeps
// one policy per thread.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvfleet/block_hash.h"

namespace kvfleet::router {

struct ReplicaState {
  std::string id;  // stable name (URL or configured name); consistent_hash keys its ring on it
  bool healthy = true;
  bool draining = false;
  std::uint32_t in_flight_requests = 0;
  std::uint64_t in_flight_tokens = 0;  // prompt + expected output tokens of requests in flight
  std::uint32_t matched_blocks = 0;    // leading prompt blocks this replica holds (PrefixTree)
  // The blocks after those that its KV tiers below the device pool hold, each counted in the best tier
  // that has it (TierIndex: the replica's engine would load them instead of computing them).
  std::uint32_t host_blocks = 0, disk_blocks = 0, shared_blocks = 0;
  // Load as the replica itself reports it (its KV event stream's `load` events; every router in front
  // of it sees the same): sequences waiting and running, KV cache usage in [0, 1].
  bool load_reported = false;
  std::uint32_t reported_waiting = 0, reported_running = 0;
  double kv_usage = 0;

  bool available() const { return healthy && !draining; }
  // Requests on the replica: this router's own count, or the replica's (all routers') when larger.
  std::uint32_t load() const {
    return load_reported ? std::max(in_flight_requests, reported_waiting + reported_running) : in_flight_requests;
  }
};

struct RoutingRequest {
  std::uint32_t prompt_blocks = 0;  // full blocks of the prompt (the hashes looked up)
  std::uint64_t prompt_tokens = 0;
  // The request's session: the policy's own header (consistent_hash), else the router's session header,
  // else the body's `user` when the router takes it ("" = none). cache_aware places by it.
  std::string_view session_key{};
  // The prompt's block hashes (Contract 1), for choices every router must compute alike (cache_aware
  // places a prefix no replica holds by rendezvous hashing of one of them).
  std::span<const BlockHash> block_hashes{};
};

struct Decision {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t replica = kNone;  // index into the span given to choose()
  std::string_view reason;      // a static string, e.g. "cache_hit", "imbalance", "least_load"
  bool ok() const { return replica != kNone; }
};

inline constexpr std::string_view kNoReplica = "no_replica_available";

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  virtual Decision choose(const RoutingRequest& request, std::span<const ReplicaState> replicas) = 0;
  // The request header whose value becomes RoutingRequest::session_key ("" = the policy needs none).
  virtual std::string_view session_header() const { return {}; }
};

// Shared by several policies: the available replica with the fewest requests (load()), then the
// fewest tokens in flight, then the lowest index. nullopt when none is available.
std::optional<std::size_t> least_loaded(std::span<const ReplicaState> replicas);
// a is less loaded than b (load(), then tokens in flight); equal loads compare false both ways.
bool less_loaded(const ReplicaState& a, const ReplicaState& b);

// Builds a policy from its config node, e.g. {name: cache_aware, cache_threshold: 0.5}; a bare
// scalar ("round_robin") means that policy with default knobs. Throws std::invalid_argument naming
// an unknown policy, an unknown knob, or a knob of the wrong type or range.
std::unique_ptr<Policy> make_policy(const YAML::Node& config);
std::unique_ptr<Policy> make_policy(std::string_view name, const YAML::Node& knobs = {});

}  // namespace kvfleet::router
