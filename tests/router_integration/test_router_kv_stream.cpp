// Hardening of the KV event stream between replica and router (Contract 2): snapshots
// applied in full, instance ids, heartbeats and the read deadline, hostile streams (bad JSON, oversized
// events) with backoff, against scripted stand-ins (standin_upstream.h) and a real replica.
#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>

#include "hardening_support.h"
#include "kvfleet/http/client.h"
#include "kvfleet/http/sse.h"
#include "router/replica_cache_index.h"

namespace kvfleet::test {
namespace json = boost::json;
namespace asio = boost::asio;
using namespace hardening;

TEST_CASE("KV events: a snapshot after cleared (one seq for all its blocks) is applied in full") {
  StandinUpstream up;
  const std::string root = root_text();
  up.set_kv_script(config_event(500, 7) + sse(R"({"seq":500,"type":"cleared","snapshot":3})") +
                   sse(R"({"seq":500,"type":"stored","snapshot":true,"block_hashes":[11],"parent":)" + root + "}") +
                   sse(R"({"seq":500,"type":"stored","snapshot":true,"block_hashes":[12],"parent":11})") +
                   sse(R"({"seq":500,"type":"stored","snapshot":true,"block_hashes":[13],"parent":12})") +
                   sse(R"({"seq":501,"type":"stored","block_hashes":[14],"parent":13})"));
  RouterProcess router({}, standin_flags({&up}, {}));
  REQUIRE(wait_until([&] { return router.replica(up.url()).at("last_seq") == 501; }, std::chrono::seconds(10)));
  const json::value admin = json::parse(router.get("/admin/replicas").body);
  CHECK(admin.at("tree").at("blocks") == 4);  // before the fix: 1 (only seq 501's block)
  CHECK(router.replica(up.url()).at("mode") == "exact");
}

TEST_CASE("KV events: a new instance id restarts from since=0 even when its seq passed ours") {
  StandinUpstream up;
  const std::string root = root_text();
  up.set_kv_script(config_event(0, 1) +
                   sse(R"({"seq":1,"type":"stored","block_hashes":[21,22],"parent":)" + root + "}"));
  up.kv_heartbeat_ms = 0;
  RouterProcess router({}, standin_flags({&up}, {"--kv-events-timeout-ms", "300"}));
  REQUIRE(wait_until([&] { return router.replica(up.url()).at("last_seq") == 1; }, std::chrono::seconds(10)));
  // The replica restarts: 40 events already, another instance. The silent stream times out, the
  // router asks since=1, sees instance 2 and must start over from 0.
  up.set_kv_script(config_event(40, 2));
  REQUIRE(wait_until([&] { return count_since(up.kv_targets(), "0") >= 2; }, std::chrono::seconds(10)));
  CHECK(count_since(up.kv_targets(), "1") >= 1);
  CHECK(json::parse(router.get("/admin/replicas").body).at("tree").at("blocks") == 0);
}

TEST_CASE("KV events: a silent stream is reconnected after kv_events_timeout; heartbeats keep it") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.kv_heartbeat_ms = 0;
  RouterProcess router({}, standin_flags({&up}, {"--kv-events-timeout-ms", "300"}));
  CHECK(wait_until([&] { return up.kv_targets().size() >= 3; }, std::chrono::seconds(10)));
  // Between a timed-out stream and the next config (the backoff grows), the router says why it guesses.
  std::string reason;
  CHECK(wait_until([&] {
    const json::object r = router.replica(up.url());
    if (r.at("mode") == "approximate") reason = json::value_to<std::string>(r.at("mode_reason"));
    return !reason.empty();
  }, std::chrono::seconds(10)));
  CHECK(reason == "no event or heartbeat for 300 ms (kv_events_timeout_ms): reconnecting");  // before: "event stream failed: The socket was closed due to a timeout"

  // A stand-in that sends heartbeats, like a real replica, keeps its one stream.
  StandinUpstream beating;
  beating.set_kv_script(config_event(0, 1));
  beating.kv_heartbeat_ms = 100;
  RouterProcess kept({}, standin_flags({&beating}, {"--kv-events-timeout-ms", "400"}));
  REQUIRE(wait_until([&] { return kept.replica(beating.url()).at("mode") == "exact"; }, std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(beating.kv_targets().size() == 1);
  CHECK(kept.replica(beating.url()).at("mode") == "exact");

  ReplicaProcess replica({"--kv-events-heartbeat-ms", "100"});
  RouterProcess follower({&replica}, {"--kv-events-timeout-ms", "400", "--health-interval-ms", "60000"});
  REQUIRE(wait_until([&] { return follower.replica(replica.base_url()).at("mode") == "exact"; }, std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // idle, with pings every 100 ms
  CHECK(follower.replica(replica.base_url()).at("mode") == "exact");
  CHECK(follower.replica(replica.base_url()).at("mode_reason") == "kv events");
}

TEST_CASE("KV events: bad JSON and oversized events are dropped with a growing backoff") {
  StandinUpstream bad;
  bad.set_kv_script(config_event(0, 1) + sse("{not json"));
  bad.kv_close = true;
  RouterProcess router({}, standin_flags({&bad}, {}));
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  // 50-100 ms, then 100-200, 200-400, 400-800, 800-1600: at most 6 streams in 2 s (before: hundreds).
  const std::size_t streams = bad.kv_targets().size();
  CHECK(streams >= 2);
  CHECK(streams <= 7);

  StandinUpstream huge;
  huge.set_kv_script(config_event(0, 1) + "data: " + std::string(5 << 20, '1'));  // never ends its line
  RouterProcess second({}, standin_flags({&huge}, {}));
  CHECK(wait_until([&] { return huge.kv_targets().size() >= 2; }, std::chrono::seconds(10)));
  CHECK(second.get("/health").status == 200);
}

TEST_CASE("a real replica's snapshot (reader ahead of its ring) gives a router index the whole cache") {
  ReplicaProcess replica({"--kv-events-heartbeat-ms", "200"});
  std::string prompt;
  for (int i = 0; i < 20; ++i) prompt += "word" + std::to_string(i) + " and some more text ";
  const std::string body = json::serialize(json::object{{"prompt", prompt}, {"max_tokens", 1}});
  REQUIRE(replica.post("/v1/completions", body).status == 200);
  // since= beyond the ring's newest seq: the replica must send cleared + a snapshot.
  asio::io_context io;
  router::ReplicaCacheIndex index(router::ReplicaCacheConfig{.block_size = 16, .root = block_hash_root("tiny-qwen")});
  index.add_replica(0);
  index.begin_stream(0);
  bool pinged = false, instance = false;
  std::size_t applied = 0;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    http::HttpClientConfig cc;
    cc.io_timeout = std::chrono::seconds(5);
    http::HttpClient client(co_await asio::this_coro::executor, cc);
    const std::string target = "/v1/kv_events?since=1000000";  // named: no temporaries in a co_await (GCC 12)
    const http::ResponseHead head = co_await open_get(client, replica.port(), target);
    REQUIRE(head.status == 200);
    http::SseParser parser;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < deadline && !pinged) {
      const auto piece = co_await client.read_some();
      if (!piece) break;
      pinged |= piece->find(": ping") != std::string::npos;
      for (const auto& e : parser.feed(*piece)) {
        instance |= e.data.find("\"instance\":") != std::string::npos;
        const auto outcome = index.apply_event(0, e.data, 1);
        applied += outcome.status == router::EventStatus::applied;
      }
    }
    client.close();
  }, [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  io.run();
  CHECK(pinged);
  CHECK(instance);
  CHECK(applied >= 2);  // cleared + stored blocks
  // The router's own hashes of the prompt: every full block the replica cached is matched.
  const auto tokens = json::parse(replica.post("/tokenize", json::serialize(json::object{{"prompt", prompt}})).body);
  std::vector<TokenId> ids;
  for (const auto& t : tokens.at("tokens").as_array()) ids.push_back(static_cast<TokenId>(t.as_int64()));
  const auto hashes = block_hashes(block_hash_root("tiny-qwen"), ids, 16);
  REQUIRE(hashes.size() >= 2);
  CHECK(index.match(hashes).of(0) == hashes.size());
}

TEST_CASE("a real replica's event stream wakes on new events, long before its heartbeat") {
  ReplicaProcess replica({"--kv-events-heartbeat-ms", "20000"});
  asio::io_context io;
  double waited = -1;
  std::thread poster;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    http::HttpClientConfig cc;
    cc.io_timeout = std::chrono::seconds(10);
    http::HttpClient client(co_await asio::this_coro::executor, cc);
    const std::string target = "/v1/kv_events?since=0";  // named: no temporaries in a co_await (GCC 12)
    const http::ResponseHead head = co_await open_get(client, replica.port(), target);
    REQUIRE(head.status == 200);
    http::SseParser parser;
    bool configured = false;
    std::chrono::steady_clock::time_point sent;
    while (waited < 0) {
      const auto piece = co_await client.read_some();
      if (!piece) break;
      for (const auto& e : parser.feed(*piece)) {
        if (!configured && e.data.find("\"config\"") != std::string::npos) {
          configured = true;
          sent = std::chrono::steady_clock::now();
          poster = std::thread([&] {
            std::string prompt;
            for (int i = 0; i < 10; ++i) prompt += "block filler text number " + std::to_string(i) + " ";
            replica.post("/v1/completions", json::serialize(json::object{{"prompt", prompt}, {"max_tokens", 1}}));
          });
        } else if (configured && e.data.find("\"stored\"") != std::string::npos) {
          waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
        }
      }
    }
    client.close();
  }, [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  io.run();
  if (poster.joinable()) poster.join();
  MESSAGE("first stored event " << waited << " s after the request was sent");
  CHECK(waited >= 0);
  CHECK(waited < 5);  // the heartbeat is 20 s: only a wake-up by the ring gets it here in time
}

}  // namespace kvfleet::test
