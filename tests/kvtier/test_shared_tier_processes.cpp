// Two kvfleet-replica processes sharing one --kv-shared-dir: the second serves the first one's conversation
// from the shared tier (cached tokens, the same answer), says so in /metrics, and the first one's KV event
// stream names the shared medium.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <chrono>
#include <thread>

#include "server/replica_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

std::size_t block_files(const fs::path& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.path().extension() == ".kvblock") ++n;
  return n;
}

std::string conversation_body(int seed) {
  std::string system = "You are a careful assistant for a shipping company.";
  for (int i = 0; i < 12; ++i) system += " Rule " + std::to_string(i) + ": answer politely, cite the order number, never guess.";
  json::object o{{"messages", json::array{json::object{{"role", "system"}, {"content", system}},
                                          json::object{{"role", "user"}, {"content", "Where is order 4521?"}},
                                          json::object{{"role", "assistant"}, {"content", "It left the depot today."}},
                                          json::object{{"role", "user"}, {"content", "When will it arrive?"}}}},
                 {"max_tokens", 8}, {"ignore_eos", true}, {"logprobs", true}};
  if (seed < 0) {
    o["temperature"] = 0;
  } else {
    o["temperature"] = 0.9;
    o["seed"] = seed;
  }
  return json::serialize(o);
}

double labelled_metric(const ReplicaProcess& r, const std::string& series) {
  const std::string text = r.get("/metrics").body;
  const std::string key = "\n" + series + " ";
  const auto at = text.find(key);
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
}

}  // namespace

TEST_CASE("a second replica serves the first one's conversation from the shared tier, with the same answer") {
  TempDir shared;
  const std::vector<std::string> flags{"--kv-shared-dir", shared.path().string(), "--num-kv-blocks", "64"};
  ReplicaProcess a(flags);
  for (const int seed : {-1, 5}) {
    CAPTURE(seed);
    const http::Response ra = a.post("/v1/chat/completions", conversation_body(seed));
    REQUIRE_MESSAGE(ra.status == 200, ra.body);
    const json::value va = json::parse(ra.body);
    const auto prompt_tokens = va.at("usage").at("prompt_tokens").as_int64();
    REQUIRE(prompt_tokens > 64);
    // Written by a's I/O threads while it runs: every full prompt block.
    const auto want = static_cast<std::size_t>(prompt_tokens / 16);
    for (int i = 0; i < 500 && block_files(shared.path()) < want; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(block_files(shared.path()) >= want);

    ReplicaProcess b(flags);  // started after a wrote: it has never seen this conversation
    const http::Response rb = b.post("/v1/chat/completions", conversation_body(seed));
    REQUIRE_MESSAGE(rb.status == 200, rb.body);
    const json::value vb = json::parse(rb.body);
    const auto cached = vb.at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
    CHECK(cached == (prompt_tokens - 1) / 16 * 16);
    CHECK(json::serialize(vb.at("choices")) == json::serialize(va.at("choices")));  // text and logprobs
    CHECK(labelled_metric(b, R"(kvfleet_kv_tier_hit_tokens_total{medium="shared"})") == static_cast<double>(cached));
    CHECK(labelled_metric(b, R"(kvfleet_kv_tier_onload_bytes_total{medium="shared"})") > 0);
  }
  CHECK(labelled_metric(a, R"(kvfleet_kv_tier_offload_bytes_total{medium="shared"})") > 0);
  CHECK(labelled_metric(a, R"(kvfleet_kv_tier_errors_total{medium="shared",reason="corrupt"})") == 0);
  const std::string events = read_events(a.port(), {R"("medium":"shared")"}, 10);
  CHECK(events.find(R"("type":"stored")") != std::string::npos);
  CHECK(events.find(R"("medium":"shared")") != std::string::npos);
}
