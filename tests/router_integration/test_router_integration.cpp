// kvfleet-router in front of two real replica processes on loopback: cache-aware placement, exact
// mode from KV events, retries around a killed replica, mid-stream failure, many connections, and
// config errors at start.
#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <csignal>
#include <fstream>
#include <thread>

#include "kvfleet/http/sse.h"
#include "router_fixture.h"

namespace kvfleet::test {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

const std::vector<std::string> kReplicaFlags{"--num-kv-blocks", "96"};

// About 190 tokens: well over 4 blocks of 16.
std::string long_system_prompt() {
  std::string s = "You are a meticulous assistant for the kvfleet project. ";
  for (int i = 0; i < 12; ++i) s += "Rule " + std::to_string(i) + ": answer briefly, cite the design, never guess. ";
  return s;
}

std::string chat_body(const std::string& system, const std::string& user, int max_tokens = 2) {
  json::array messages{json::object{{"role", "system"}, {"content", system}},
                       json::object{{"role", "user"}, {"content", user}}};
  return json::serialize(json::object{{"model", "tiny-qwen"}, {"messages", messages}, {"max_tokens", max_tokens}});
}

std::string completion_body(const std::string& prompt, int max_tokens = 2, bool stream = false) {
  return json::serialize(json::object{{"model", "tiny-qwen"}, {"prompt", prompt}, {"max_tokens", max_tokens},
                                      {"stream", stream}, {"ignore_eos", true}});
}

std::string served_by(const http::Response& r) {
  const std::string* v = r.headers.find("x-kvfleet-replica");
  return v ? *v : "";
}

}  // namespace

// Six chats sharing a long system prompt, one after another: all land where the first one went.
void check_shared_prompt_affinity(bool exact) {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags);
  RouterProcess router({&a, &b}, {"--kv-events", exact ? "true" : "false"});
  const std::string system = long_system_prompt();
  const http::Response first = router.post("/v1/chat/completions", chat_body(system, "Question 0?"));
  REQUIRE(first.status == 200);
  const std::string home = served_by(first);
  REQUIRE((home == a.base_url() || home == b.base_url()));
  if (exact) {  // the router learns the prompt's blocks from the replica's KV events
    REQUIRE(wait_until([&] { return router.replica(home).at("events_applied").as_int64() > 0; },
                       std::chrono::seconds(10)));
  }
  CHECK(router.replica(home).at("mode") == (exact ? "exact" : "approximate"));
  for (int i = 1; i <= 5; ++i) {
    const http::Response r = router.post("/v1/chat/completions", chat_body(system, "Question " + std::to_string(i) + "?"));
    REQUIRE(r.status == 200);
    CHECK(served_by(r) == home);
  }
  const ReplicaProcess& cached = home == a.base_url() ? a : b;
  const ReplicaProcess& other = home == a.base_url() ? b : a;
  CHECK(cached.metric("kvfleet_prefix_cache_hits_tokens_total") >= 5 * 4 * 16);
  CHECK(other.metric("kvfleet_prefix_cache_hits_tokens_total") == 0);
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"cache_hit\"") == 5);
  CHECK(router.metric("kvfleet_router_requests_total", "status=\"200\"") == 6);
  CHECK(router.metric("kvfleet_router_prefix_match_ratio_count") == 6);

  // Answered by the router itself.
  const http::Response bad = router.post("/v1/chat/completions", "{not json");
  CHECK(bad.status == 400);
  CHECK(bad.body.find("invalid_request_error") != std::string::npos);
  const json::value models = json::parse(router.get("/v1/models").body);
  CHECK(models.at("data").at(0).at("id").as_string() == "tiny-qwen");
  CHECK(router.get("/health").status == 200);
}

TEST_CASE("requests sharing a long system prompt land on the replica that caches it (exact mode)") {
  check_shared_prompt_affinity(true);
}

TEST_CASE("requests sharing a long system prompt land on the replica that caches it (approximate mode)") {
  check_shared_prompt_affinity(false);
}

TEST_CASE("exact mode: blocks a replica cached without the router attract the prompt to it") {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags);
  RouterProcess router({&a, &b});
  REQUIRE(wait_until([&] { return router.replica(b.base_url()).at("mode") == "exact"; }, std::chrono::seconds(10)));
  CHECK(router.replica(b.base_url()).at("events_applied").as_int64() == 0);
  // Straight to b, behind the router's back: only b's KV events can tell the router.
  const std::string prompt = long_system_prompt() + " Now summarize the rules.";
  REQUIRE(b.post("/v1/completions", completion_body(prompt)).status == 200);
  REQUIRE(wait_until([&] { return router.replica(b.base_url()).at("events_applied").as_int64() > 0; },
                     std::chrono::seconds(10)));
  const json::value admin = json::parse(router.get("/admin/replicas").body);
  CHECK(admin.at("tree").at("blocks").as_int64() >= 4);
  // With no cache anywhere, least load would pick a (index 0); b's blocks must win.
  const http::Response r = router.post("/v1/completions", completion_body(prompt));
  REQUIRE(r.status == 200);
  CHECK(served_by(r) == b.base_url());
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"cache_hit\"") == 1);

  // Admin API. A draining replica takes no new requests, even for its own prefix.
  REQUIRE(router.post("/admin/replicas/drain?url=" + b.base_url(), "").status == 200);
  CHECK(router.replica(b.base_url()).at("draining") == true);
  CHECK(served_by(router.post("/v1/completions", completion_body(prompt))) == a.base_url());
  // Removed: gone from the list (and its marks from the tree).
  const http::Response removed = http::http_request("127.0.0.1", router.port(), "DELETE", "/admin/replicas?url=" + b.base_url());
  CHECK(removed.status == 200);
  const json::value after = json::parse(router.get("/admin/replicas").body);
  REQUIRE(after.at("replicas").as_array().size() == 1);
  CHECK(after.at("replicas").at(0).at("url").as_string() == a.base_url());
  // Added back: a fresh subscription replays b's events from the start (since=0).
  const http::Response added = router.post("/admin/replicas", json::serialize(json::object{{"url", b.base_url()}}));
  CHECK(added.status == 201);
  CHECK(wait_until([&] { return router.replica(b.base_url()).at("events_applied").as_int64() > 0; },
                   std::chrono::seconds(10)));
  CHECK(router.post("/admin/replicas", json::serialize(json::object{{"url", b.base_url()}})).status == 400);
}

TEST_CASE("active health checks take a stalled replica out and bring it back") {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags);
  RouterProcess router({&a, &b}, {"--health-interval-ms", "100", "--health-timeout-ms", "300"});
  a.process().signal(SIGSTOP);  // accepts connections (the kernel does) but never answers
  CHECK(wait_until([&] { return router.replica(a.base_url()).at("healthy") == false; }, std::chrono::seconds(10)));
  for (int i = 0; i < 3; ++i) CHECK(served_by(router.post("/v1/completions", completion_body("Hi"))) == b.base_url());
  a.process().signal(SIGCONT);
  CHECK(wait_until([&] { return router.replica(a.base_url()).at("healthy") == true; }, std::chrono::seconds(10)));
  CHECK(router.post("/v1/completions", completion_body("Hi")).status == 200);
}

TEST_CASE("a replica killed before answering: every request succeeds on the other one") {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags);
  // Slow health checks: only the failed forward itself can take a out of rotation.
  RouterProcess router({&a, &b}, {"--policy", "round_robin", "--health-interval-ms", "60000"});
  a.process().signal(SIGKILL);
  a.process().wait(std::chrono::seconds(5));
  for (int i = 0; i < 8; ++i) {
    const http::Response r = router.post("/v1/completions", completion_body("Hello number " + std::to_string(i)));
    REQUIRE(r.status == 200);
    CHECK(served_by(r) == b.base_url());
  }
  CHECK(router.metric("kvfleet_router_retries_total") == 1);
  CHECK(router.replica(a.base_url()).at("healthy") == false);
  // SIGTERM drains and exits cleanly.
  router.process().signal(SIGTERM);
  CHECK(router.process().wait(std::chrono::seconds(10)) == 0);
}

namespace {

struct StreamResult {
  int status = 0;
  std::string replica;
  std::string body;
};

// Streams a completion; `on_first_piece` runs once the first bytes arrived and says whether to read
// on (false: the client hangs up).
StreamResult stream_completion(std::uint16_t port, const std::string& body, const std::function<bool(const std::string&)>& on_first_piece) {
  asio::io_context io;
  StreamResult result;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    http::HttpClient client(co_await asio::this_coro::executor);
    const std::string host = "127.0.0.1";
    co_await client.connect(host, port);
    http::Request request;
    request.method = "POST";
    request.target = "/v1/completions";
    request.body = body;
    request.headers.set("content-type", "application/json");
    co_await client.send(request);
    const http::ResponseHead head = co_await client.read_head();
    result.status = head.status;
    if (const std::string* r = head.headers.find("x-kvfleet-replica")) result.replica = *r;
    bool first = true;
    while (std::optional<std::string> piece = co_await client.read_some()) {
      result.body += *piece;
      if (first && !on_first_piece(result.replica)) break;
      first = false;
    }
  }, asio::detached);
  io.run();
  return result;
}

}  // namespace

double aborted_requests(const ReplicaProcess& r) {
  const std::string text = r.get("/metrics").body;
  const std::regex line("kvfleet_requests_finished_total\\{finish_reason=\"abort\"\\} ([0-9.eE+-]+)");
  std::smatch m;
  return std::regex_search(text, m, line) ? std::stod(m[1]) : -1.0;
}

TEST_CASE("failover off: a replica killed mid-stream ends the stream with an error event; the router keeps serving") {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags);
  RouterProcess router({&a, &b}, {"--failover", "false"});
  // A client that hangs up mid-stream: the router closes the upstream connection, the replica aborts.
  const StreamResult left = stream_completion(router.port(), completion_body("Tell me a long story", 3000, true),
                                              [](const std::string&) { return false; });
  REQUIRE(left.status == 200);
  const ReplicaProcess& serving = left.replica == a.base_url() ? a : b;
  CHECK(wait_until([&] { return aborted_requests(serving) == 1; }, std::chrono::seconds(10)));
  const StreamResult s = stream_completion(router.port(), completion_body("Tell me a long story", 1500, true),
                                           [&](const std::string& replica) {
                                             (replica == a.base_url() ? a : b).process().signal(SIGKILL);
                                             return true;
                                           });
  REQUIRE(s.status == 200);
  CHECK(s.body.find("data: {\"error\":") != std::string::npos);
  CHECK(s.body.size() >= 14);
  CHECK(s.body.substr(s.body.size() - 14) == "data: [DONE]\n\n");
  CHECK(router.metric("kvfleet_router_requests_total", "status=\"upstream_error\"") == 1);
  for (int i = 0; i < 3; ++i) {
    const http::Response r = router.post("/v1/completions", completion_body("Still there?"));
    REQUIRE(r.status == 200);
    CHECK(served_by(r) != s.replica);
  }
}

namespace {

// Sends `count` requests at once, each on its own connection; returns how many got `status`.
int concurrent_posts(std::uint16_t port, int count, const std::string& body, int status) {
  asio::io_context io;
  int matched = 0;
  for (int i = 0; i < count; ++i) {
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      try {
        http::HttpClientConfig cc;
        cc.io_timeout = std::chrono::seconds(60);
        http::HttpClient client(co_await asio::this_coro::executor, cc);
        const std::string host = "127.0.0.1";
        co_await client.connect(host, port);
        http::Request request;
        request.method = "POST";
        request.target = "/v1/completions";
        request.body = body;
        request.headers.set("content-type", "application/json");
        const http::Response r = co_await client.request(request);
        matched += r.status == status;
      } catch (const std::exception&) {
      }
    }, asio::detached);
  }
  io.run();
  return matched;
}

}  // namespace

TEST_CASE("hundreds of concurrent connections are all served") {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags);
  RouterProcess router({&a, &b}, {"--policy", "least_load"});
  // 200 real completions at once (the tiny model's compute bounds how many fit in seconds).
  auto started = std::chrono::steady_clock::now();
  CHECK(concurrent_posts(router.port(), 200, completion_body("Hi", 1), 200) == 200);
  MESSAGE("200 concurrent completions: " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");
  CHECK(router.metric("kvfleet_router_requests_total", "status=\"200\"") == 200);
  // One token each, all generated by the replicas (whose counters may trail their responses a little).
  double tokens_a = 0, tokens_b = 0;
  CHECK(wait_until([&] {
    tokens_a = a.metric("kvfleet_generation_tokens_total");
    tokens_b = b.metric("kvfleet_generation_tokens_total");
    return tokens_a + tokens_b == 200;
  }, std::chrono::seconds(5)));
  CHECK(tokens_a > 0);  // least_load spread them
  CHECK(tokens_b > 0);
  // 1000 at once through the whole path (tokenize, route, forward, relay) that the replicas turn
  // down at once (max_tokens 0 is invalid): the router's own concurrency, without model compute.
  started = std::chrono::steady_clock::now();
  CHECK(concurrent_posts(router.port(), 1000, completion_body("Hi", 0), 400) == 1000);
  MESSAGE("1000 concurrent proxied requests: " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");
  CHECK(router.metric("kvfleet_router_requests_total", "status=\"400\"") == 1000);
}

TEST_CASE("an unknown config key fails at start, naming the key") {
  TempDir dir;
  const auto model = make_router_model(dir);
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "model: " << model.string() << "\nreplicas: [http://127.0.0.1:1]\npolicy: cache_aware\nmax_atempts: 3\n";
  }
  const CommandResult r = run_command(bin_dir() + "/kvfleet-router --config " + (dir / "router.yaml").string() + " 2>&1");
  CHECK(r.status == 1);
  CHECK(r.out.find("'max_atempts' is not a known setting") != std::string::npos);
  const CommandResult knob = run_command(bin_dir() + "/kvfleet-router --model " + model.string() +
                                         " --replica http://127.0.0.1:1 --policy cache_awar 2>&1");
  CHECK(knob.status == 1);
  CHECK(knob.out.find("cache_awar") != std::string::npos);
}

TEST_CASE("overload: one forwarding slot, one queue place, then 429; the queued request is served") {
  ReplicaProcess a(kReplicaFlags);
  RouterProcess router({&a}, {"--max-concurrency", "1", "--max-queue", "1"});
  int queued_status = 0, rejected_status = 0;
  std::thread queued;
  const StreamResult s = stream_completion(router.port(), completion_body("Tell me a long story", 3000, true),
                                           [&](const std::string&) {
                                             queued = std::thread([&] {
                                               queued_status = router.post("/v1/completions", completion_body("Hi")).status;
                                             });
                                             CHECK(wait_until([&] {
                                               return json::parse(router.get("/admin/replicas").body).at("queued") == 1;
                                             }, std::chrono::seconds(10)));
                                             rejected_status = router.post("/v1/completions", completion_body("Hi")).status;
                                             return false;  // hang up: the slot goes to the queued request
                                           });
  queued.join();
  CHECK(s.status == 200);
  CHECK(rejected_status == 429);
  CHECK(queued_status == 200);
  CHECK(router.metric("kvfleet_router_rejected_total") == 1);
}


TEST_CASE("API keys are enforced, and SIGHUP applies a changed replica list and keys") {
  ReplicaProcess a, b;
  TempDir dir;
  auto write_yaml = [&](const std::vector<std::string>& replicas, const std::string& key) {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "replicas:\n";
    for (const auto& r : replicas) yaml << "  - " << r << "\n";
    yaml << "api_keys: [" << key << "]\n";
    yaml << "admin_api_key: admin-key\n";
  };
  write_yaml({a.base_url()}, "key-one");
  RouterProcess router({}, {"--config", (dir / "router.yaml").string()});
  router.set_admin_key("admin-key");
  auto complete = [&](const std::string& key) {
    http::Headers h{{"Content-Type", "application/json"}};
    if (!key.empty()) h.add("Authorization", "Bearer " + key);
    return http::http_request("127.0.0.1", router.port(), "POST", "/v1/completions",
                              R"({"prompt":"hello","max_tokens":2})", h, std::chrono::seconds(60));
  };
  CHECK(complete("").status == 401);
  CHECK(json::parse(complete("wrong").body).at("error").at("code") == "invalid_api_key");
  CHECK(complete("key-one").status == 200);
  CHECK(router.get("/v1/models").status == 401);

  write_yaml({a.base_url(), b.base_url()}, "key-two");
  router.process().signal(SIGHUP);
  CHECK(wait_until([&] { return json::parse(router.get("/admin/replicas").body).at("replicas").as_array().size() == 2; },
                   std::chrono::seconds(10)));
  CHECK(complete("key-one").status == 401);
  CHECK(complete("key-two").status == 200);
}

TEST_CASE("the router's probes: /readiness follows its replicas, /liveness the process") {
  // Nothing listens on port 1: the only replica is refused, so the router is alive but not ready.
  RouterProcess router({}, {"--replica", "http://127.0.0.1:1", "--policy", "round_robin"});
  CHECK(wait_until([&] { return router.get("/readiness").status == 503; }, std::chrono::seconds(10)));
  CHECK(router.get("/health").status == 503);
  const http::Response live = router.get("/liveness");
  CHECK(live.status == 200);
  CHECK(live.body.find("alive") != std::string::npos);
}

}  // namespace kvfleet::test

namespace kvfleet::test {

// The router renders tools as the replica does (kvfleet/chat_tools.h): the prompt's blocks it hashes are
// the ones the replica caches, so a second request with the same tools is a cache hit on the same replica.
TEST_CASE("chat with tools: the router's hashes match the replica's blocks, and tool fields pass through") {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags);
  RouterProcess router({&a, &b});
  REQUIRE(wait_until([&] { return router.replica(b.base_url()).at("mode") == "exact"; }, std::chrono::seconds(10)));
  json::array tools;
  for (int i = 0; i < 6; ++i)
    tools.push_back(json::object{{"type", "function"},
                                 {"function", json::object{{"name", "tool_" + std::to_string(i)},
                                                           {"description", "Looks up fact number " + std::to_string(i)},
                                                           {"parameters", json::parse(R"({"type":"object","properties":
                                                              {"query":{"type":"string"}},"required":["query"]})")}}}});
  auto body = [&](const std::string& user) {
    return json::serialize(json::object{
        {"model", "tiny-qwen"}, {"tools", tools}, {"tool_choice", "none"}, {"max_tokens", 2},
        {"messages", json::array{json::object{{"role", "user"}, {"content", user}}}}});
  };
  const http::Response first = router.post("/v1/chat/completions", body("First question?"));
  REQUIRE(first.status == 200);
  const std::string home = served_by(first);
  REQUIRE(wait_until([&] { return router.replica(home).at("events_applied").as_int64() > 0; }, std::chrono::seconds(10)));
  const http::Response second = router.post("/v1/chat/completions", body("Second question?"));
  REQUIRE(second.status == 200);
  CHECK(served_by(second) == home);
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"cache_hit\"") == 1);
  // The replica's answer to tool_choice auto without its flags comes back through the router unchanged.
  const http::Response refused = router.post("/v1/chat/completions",
                                             json::serialize(json::object{{"tools", tools}, {"messages", json::array{
                                                 json::object{{"role", "user"}, {"content", "hi"}}}}}));
  CHECK(refused.status == 400);
  CHECK(refused.body.find("--enable-auto-tool-choice") != std::string::npos);
}

}  // namespace kvfleet::test
