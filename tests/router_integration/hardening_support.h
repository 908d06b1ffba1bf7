// Shared by the router hardening tests: request bodies, stand-in flags, KV event script
// pieces, and a plain request with a Bearer key.
#pragma once

#include <algorithm>

#include "kvfleet/block_hash.h"
#include "router_fixture.h"
#include "standin_upstream.h"

namespace kvfleet::test::hardening {

inline const std::string kBody = R"({"model":"tiny-qwen","prompt":"Hello there","max_tokens":2})";
inline const std::string kStreamBody = R"({"model":"tiny-qwen","prompt":"Hello there","max_tokens":2,"stream":true})";

inline std::string served_by(const http::Response& r) {
  const std::string* v = r.headers.find("x-kvfleet-replica");
  return v ? *v : "";
}

inline std::vector<std::string> standin_flags(const std::vector<const StandinUpstream*>& upstreams, std::vector<std::string> more) {
  std::vector<std::string> flags{"--health-interval-ms", "60000"};
  for (const auto* u : upstreams) {
    flags.push_back("--replica");
    flags.push_back(u->url());
  }
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

inline std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

// The router's root for the tiny model's namespace (the config event must carry it).
inline std::string root_text() { return std::to_string(kvfleet::block_hash_root("tiny-qwen")); }

inline std::string config_event(std::uint64_t seq, std::uint64_t instance) {
  return sse(R"({"type":"config","seq":)" + std::to_string(seq) + R"(,"block_size":16,"root":)" + root_text() +
             R"(,"instance":)" + std::to_string(instance) + "}");
}

inline http::Response request(std::uint16_t port, const std::string& method, const std::string& target,
                       const std::string& body, const std::string& key) {
  http::Headers h{{"Content-Type", "application/json"}};
  if (!key.empty()) h.add("Authorization", "Bearer " + key);
  return http::http_request("127.0.0.1", port, method, target, body, h, std::chrono::seconds(30));
}

inline std::size_t count_since(const std::vector<std::string>& targets, const std::string& since) {
  // The router may add parameters after since= (load=1).
  const std::string want = "/v1/kv_events?since=" + since;
  return static_cast<std::size_t>(std::count_if(targets.begin(), targets.end(), [&](const std::string& t) {
    return t == want || t.rfind(want + "&", 0) == 0;
  }));
}

}  // namespace kvfleet::test::hardening
