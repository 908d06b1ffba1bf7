// Helpers of the prefill/decode tests: requests with the x-kvfleet-prefill-from header, token-id prompts,
// labelled metrics, and the "nothing leaked" check on a replica's /internal/kv_state.
#pragma once

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <chrono>
#include <cstdlib>
#include <string_view>
#include <string>
#include <thread>
#include <vector>

#include "kvfleet/http/client.h"

namespace kvfleet::test {

namespace json = boost::json;

// The KV transport the process tests run over: KVFLEET_TEST_PD_TRANSPORT=ucx (ctest's pd_ucx) or tcp
// (the default). Every P and D of those tests gets pd_transport_flags(); a ucx run also asserts that its
// pulls went over ucx (pulls_total_on).
inline bool ucx_run() {
  const char* t = std::getenv("KVFLEET_TEST_PD_TRANSPORT");
  return t && std::string_view(t) == "ucx";
}
inline std::vector<std::string> with_transport(std::vector<std::string> flags) {
  flags.push_back("--pd-transports");
  flags.push_back(ucx_run() ? "ucx,tcp" : "tcp");
  return flags;
}
inline std::string pulls_on(const std::string& transport) {
  return "kvfleet_pd_pulls_total{transport=\"" + transport + "\"}";
}

// Token ids of a prompt: `n` tokens from a stream that `seed` picks (same seed: same prefix).
inline std::vector<int> prompt_ids(int seed, int n, int from = 0) {
  std::vector<int> ids;
  for (int i = from; i < from + n; ++i) ids.push_back(1000 + (seed * 7919 + i * 104729) % 20000);
  return ids;
}

inline std::vector<int> concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A completion body: greedy when seed < 0, else sampled at temperature 0.9 with that seed; logprobs on, so
// equal answers mean equal tokens and equal logits.
inline std::string completion_body(const std::vector<int>& ids, int seed, int max_tokens = 5) {
  json::object o{{"prompt", json::value_from(ids)}, {"max_tokens", max_tokens}, {"logprobs", 1}, {"ignore_eos", true}};
  if (seed < 0) {
    o["temperature"] = 0;
  } else {
    o["temperature"] = 0.9;
    o["seed"] = seed;
  }
  return json::serialize(o);
}

inline http::Response post(std::uint16_t port, const std::string& target, const std::string& body,
                           const std::string& prefill_from = {}) {
  http::Headers h{{"Content-Type", "application/json"}};
  if (!prefill_from.empty()) h.add("x-kvfleet-prefill-from", prefill_from);
  return http::http_request("127.0.0.1", port, "POST", target, body, h, std::chrono::seconds(60));
}

// What a client sees of an answer: the text and the logprobs of every choice (usage differs: cached tokens).
inline std::string answer_of(const http::Response& r) {
  REQUIRE_MESSAGE(r.status == 200, r.body);
  const json::value v = json::parse(r.body);
  json::array out;
  for (const auto& c : v.at("choices").as_array())
    out.push_back(json::object{{"text", c.as_object().contains("text") ? c.at("text") : c.at("message")},
                               {"logprobs", c.at("logprobs")}, {"finish", c.at("finish_reason")}});
  return json::serialize(out);
}

// The value of `series` (a metric name with its labels, e.g. kvfleet_x_total{reason="y"}) in /metrics; 0 if absent.
inline double metric_value(std::uint16_t port, const std::string& series) {
  const std::string text = http::http_request("127.0.0.1", port, "GET", "/metrics").body;
  const std::string key = "\n" + series + " ";
  const auto at = text.find(key);
  return at == std::string::npos ? 0.0 : std::stod(text.substr(at + key.size()));
}

inline json::object kv_state(std::uint16_t port) {
  return json::parse(http::http_request("127.0.0.1", port, "GET", "/internal/kv_state").body).as_object();
}

// Waits (up to `limit`) until the replica is idle with no pin, no lease and every block free, and its
// integrity check passes; then asserts exactly that.
inline void check_no_leak(std::uint16_t port, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  json::object s;
  for (;;) {
    s = kv_state(port);
    const bool clean = s.at("pins").as_int64() == 0 && s.at("leases").as_int64() == 0 &&
                       s.at("running").as_int64() == 0 && s.at("waiting").as_int64() == 0 &&
                       s.at("free_blocks") == s.at("num_blocks");
    if (clean || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CAPTURE(json::serialize(s));
  CHECK(s.at("integrity") == "ok");
  CHECK(s.at("pins").as_int64() == 0);
  CHECK(s.at("leases").as_int64() == 0);
  CHECK(s.at("free_blocks") == s.at("num_blocks"));
}

}  // namespace kvfleet::test
