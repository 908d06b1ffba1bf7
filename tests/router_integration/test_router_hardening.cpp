// Issue 16 hardening of kvfleet-router, against scripted stand-in replicas (standin_upstream.h) and a
// real replica: the KV event protocol (snapshots, instance ids, heartbeats, hostile streams), the
// admin API's key and input checks, the Authorization sent upstream, the circuit breaker's verdicts,
// faults (refused, hung, died mid-stream, malformed, 5xx) with bounded memory, and metric cleanup.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <fstream>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>

#include "kvfleet/http/client.h"
#include "kvfleet/http/sse.h"
#include "router/replica_cache_index.h"
#include "router_fixture.h"
#include "standin_upstream.h"

namespace kvfleet::test {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

const std::string kBody = R"({"model":"tiny-qwen","prompt":"Hello there","max_tokens":2})";
const std::string kStreamBody = R"({"model":"tiny-qwen","prompt":"Hello there","max_tokens":2,"stream":true})";

std::string served_by(const http::Response& r) {
  const std::string* v = r.headers.find("x-kvfleet-replica");
  return v ? *v : "";
}

std::vector<std::string> standin_flags(const std::vector<const StandinUpstream*>& upstreams, std::vector<std::string> more) {
  std::vector<std::string> flags{"--health-interval-ms", "60000"};
  for (const auto* u : upstreams) {
    flags.push_back("--replica");
    flags.push_back(u->url());
  }
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

// The router's root for the tiny model's namespace (the config event must carry it).
std::string root_text() { return std::to_string(block_hash_root("tiny-qwen")); }

std::string config_event(std::uint64_t seq, std::uint64_t instance) {
  return sse(R"({"type":"config","seq":)" + std::to_string(seq) + R"(,"block_size":16,"root":)" + root_text() +
             R"(,"instance":)" + std::to_string(instance) + "}");
}

http::Response request(std::uint16_t port, const std::string& method, const std::string& target,
                       const std::string& body, const std::string& key) {
  http::Headers h{{"Content-Type", "application/json"}};
  if (!key.empty()) h.add("Authorization", "Bearer " + key);
  return http::http_request("127.0.0.1", port, method, target, body, h, std::chrono::seconds(30));
}

// A streamed completion sent on a raw socket whose receive buffer is tiny, read only after `stall`:
// the router's writes to it block. Returns the bytes read.
std::string slow_stream_read(std::uint16_t port, std::chrono::milliseconds stall) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                          "Content-Length: " + std::to_string(kStreamBody.size()) + "\r\n\r\n" + kStreamBody;
  REQUIRE(::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::this_thread::sleep_for(stall);
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return got;
}

std::size_t count_since(const std::vector<std::string>& targets, const std::string& since) {
  return static_cast<std::size_t>(std::count(targets.begin(), targets.end(), "/v1/kv_events?since=" + since));
}

}  // namespace

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
  RouterProcess router({}, standin_flags({&up}, {"--kv-events-timeout-ms", "300"}));
  CHECK(wait_until([&] { return up.kv_targets().size() >= 3; }, std::chrono::seconds(10)));

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
    const std::string host = "127.0.0.1";
    co_await client.connect(host, replica.port());
    http::Request req;
    req.method = "GET";
    req.target = "/v1/kv_events?since=1000000";
    co_await client.send(req);
    const http::ResponseHead head = co_await client.read_head();
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
    const std::string host = "127.0.0.1";
    co_await client.connect(host, replica.port());
    http::Request req;
    req.method = "GET";
    req.target = "/v1/kv_events?since=0";
    co_await client.send(req);
    REQUIRE((co_await client.read_head()).status == 200);
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

TEST_CASE("admin API: its own key, 400 on a bad url escape or URL, and api keys compared whole") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  RouterProcess router({}, standin_flags({&up}, {"--api-key", "client-key", "--admin-api-key", "admin-key"}));
  CHECK(request(router.port(), "GET", "/admin/replicas", "", "").status == 401);
  CHECK(request(router.port(), "GET", "/admin/replicas", "", "client-key").status == 401);
  CHECK(request(router.port(), "GET", "/admin/replicas", "", "admin-ke").status == 401);
  CHECK(request(router.port(), "GET", "/admin/replicas", "", "admin-key").status == 200);
  CHECK(request(router.port(), "POST", "/v1/completions", kBody, "client-keyX").status == 401);
  CHECK(request(router.port(), "POST", "/v1/completions", kBody, "client-key").status == 200);
  const http::Response bad_escape = request(router.port(), "DELETE", "/admin/replicas?url=%zz", "", "admin-key");
  CHECK(bad_escape.status == 400);
  CHECK(json::parse(bad_escape.body).at("error").at("param") == "url");
  CHECK(request(router.port(), "DELETE", "/admin/replicas?url=%4", "", "admin-key").status == 400);
  for (const std::string url : {"http://127.0.0.1:80abc", "http://127.0.0.1:0", "http://127.0.0.1:99999",
                                "http://user@127.0.0.1:80", "http://127.0.0.1:80/x", "ftp://127.0.0.1:80",
                                "http://:80", "http://a b:80", "http://127.0.0.1"}) {
    INFO(url);
    CHECK(request(router.port(), "POST", "/admin/replicas", json::serialize(json::object{{"url", url}}), "admin-key").status ==
          400);
  }
  CHECK(request(router.port(), "POST", "/admin/replicas", R"({"url":"http://[::1]:9"})", "admin-key").status == 201);

  // api_keys without admin_api_key: the admin API is off.
  RouterProcess locked({}, standin_flags({&up}, {"--api-key", "client-key"}));
  CHECK(request(locked.port(), "GET", "/admin/replicas", "", "client-key").status == 403);
}

TEST_CASE("the client's Authorization is not forwarded; the replica key is, on every path") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  {
    RouterProcess router({}, standin_flags({&up}, {"--api-key", "client-key", "--replica-api-key", "replica-key"}));
    REQUIRE(request(router.port(), "POST", "/v1/completions", kBody, "client-key").status == 200);
    CHECK(up.last_authorization() == "Bearer replica-key");
    CHECK(wait_until([&] { return up.kv_authorization() == "Bearer replica-key"; }, std::chrono::seconds(5)));
  }
  {
    RouterProcess router({}, standin_flags({&up}, {"--api-key", "client-key"}));
    REQUIRE(request(router.port(), "POST", "/v1/completions", kBody, "client-key").status == 200);
    CHECK(up.last_authorization() == "<none>");
  }
  {
    RouterProcess router({}, standin_flags({&up}, {"--api-key", "client-key", "--forward-authorization", "true"}));
    REQUIRE(request(router.port(), "POST", "/v1/completions", kBody, "client-key").status == 200);
    CHECK(up.last_authorization() == "Bearer client-key");
  }
}

TEST_CASE("circuit breaker: 4xx answers and 503s do not open it; 500s do") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.status = 400;
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "circuit_breaker: {consecutive_failures: 3, open_ms: 60000, half_open_probes: 1}\nmax_attempts: 1\n";
  }
  RouterProcess router({}, standin_flags({&up}, {"--config", (dir / "router.yaml").string()}));
  for (int i = 0; i < 5; ++i) CHECK(router.post("/v1/completions", kBody).status == 400);
  CHECK(router.replica(up.url()).at("circuit_breaker") == "closed");
  up.status = 503;
  for (int i = 0; i < 5; ++i) CHECK(router.post("/v1/completions", kBody).status == 503);
  CHECK(router.replica(up.url()).at("circuit_breaker") == "closed");  // busy, not broken
  up.status = 500;
  for (int i = 0; i < 3; ++i) CHECK(router.post("/v1/completions", kBody).status == 500);
  CHECK(router.replica(up.url()).at("circuit_breaker") == "open");
}

TEST_CASE("faults: refused, hung, dead mid-stream, malformed, 5xx; retriable requests all served once") {
  StandinUpstream good, faulty;
  good.set_kv_script(config_event(0, 1));
  faulty.set_kv_script(config_event(0, 2));
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "upstream_timeout_ms: 500\nmax_attempts: 2\npolicy: round_robin\n"
            "circuit_breaker: {consecutive_failures: 0}\n";
  }
  const std::string refused = "http://127.0.0.1:1";  // nothing listens there
  std::vector<std::string> flags = standin_flags({&good, &faulty}, {"--config", (dir / "router.yaml").string()});
  RouterProcess router({}, flags);
  // n requests that a working replica can serve: every one succeeds, and the working replicas saw
  // exactly n (none lost, none sent twice to a replica that answered).
  auto run = [&](const std::string& what, int n, bool faulty_answers) {
    INFO(what);
    const int good_before = good.completion_requests(), faulty_before = faulty.completion_requests();
    int ok = 0;
    for (int i = 0; i < n; ++i) ok += router.post("/v1/completions", kBody).status == 200;
    CHECK(ok == n);
    const int served = good.completion_requests() - good_before + (faulty_answers ? faulty.completion_requests() - faulty_before : 0);
    CHECK(served == n);
  };
  faulty.hang_ms = 2000;  // before the first byte: the try times out and goes to the other
  run("hung", 4, false);
  faulty.hang_ms = 0;

  // A 5xx is the replica's answer and is passed on (not retried: a 500 caused by the input would
  // fail everywhere); each request is answered exactly once.
  faulty.status = 502;
  int ok = 0, bad_gateway = 0;
  const int good_before = good.completion_requests();
  for (int i = 0; i < 6; ++i) {
    const int status = router.post("/v1/completions", kBody).status;
    ok += status == 200;
    bad_gateway += status == 502;
  }
  CHECK(ok + bad_gateway == 6);
  CHECK(good.completion_requests() - good_before == ok);
  faulty.status = 200;

  // Died mid-stream / malformed framing: the client gets what was sent, then an error event and [DONE].
  good.stream_events = 5;
  faulty.stream_events = 5;
  faulty.die_after_events = 2;
  int errors = 0;
  for (int i = 0; i < 4; ++i) {
    const http::Response r = router.post("/v1/completions", kStreamBody);
    CHECK(r.status == 200);
    CHECK(r.body.ends_with("data: [DONE]\n\n"));
    errors += r.body.find("upstream_error") != std::string::npos;
    if (served_by(r) == faulty.url()) CHECK(r.body.find("upstream_error") != std::string::npos);
  }
  CHECK(errors == 2);
  faulty.die_after_events = 0;
  faulty.malformed_stream = true;
  for (int i = 0; i < 4; ++i) {
    const http::Response r = router.post("/v1/completions", kStreamBody);
    CHECK(r.body.ends_with("data: [DONE]\n\n"));
  }
  faulty.malformed_stream = false;
  good.stream_events = 0;
  faulty.stream_events = 0;

  // Refused: added through the admin API, then every request still succeeds.
  REQUIRE(router.post("/admin/replicas", json::serialize(json::object{{"url", refused}})).status == 201);
  run("refused", 6, true);

  // Memory stays bounded over many requests through the faults.
  const long rss_before = router.rss_kib();
  faulty.status = 500;
  for (int i = 0; i < 300; ++i) router.post("/v1/completions", kBody);
  const long rss_after = router.rss_kib();
  INFO("rss before " << rss_before << " KiB, after " << rss_after << " KiB");
  CHECK(rss_after - rss_before < 16 * 1024);
}

TEST_CASE("a removed replica's labelled metric series are deleted") {
  StandinUpstream a, b;
  a.set_kv_script(config_event(0, 1));
  b.set_kv_script(config_event(0, 2));
  RouterProcess router({}, standin_flags({&a, &b}, {"--policy", "round_robin"}));
  for (int i = 0; i < 4; ++i) REQUIRE(router.post("/v1/completions", kBody).status == 200);
  REQUIRE(router.get("/metrics").body.find(b.url()) != std::string::npos);
  REQUIRE(request(router.port(), "DELETE", "/admin/replicas?url=" + b.url(), "", "").status == 200);
  const std::string text = router.get("/metrics").body;
  CHECK(text.find(b.url()) == std::string::npos);
  CHECK(text.find(a.url()) != std::string::npos);
}

TEST_CASE("a stream that breaks while the client reads slowly does not count against the replica") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.stream_events = 200;
  up.event_padding = 64 * 1024;  // ~13 MB: far beyond the socket buffers
  up.die_after_events = 150;     // then the replica's side breaks (as its write deadline would)
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "circuit_breaker: {consecutive_failures: 1, open_ms: 60000, half_open_probes: 1}\nmax_attempts: 1\n";
  }
  RouterProcess router({}, standin_flags({&up}, {"--config", (dir / "router.yaml").string()}));
  const std::string slow = slow_stream_read(router.port(), std::chrono::milliseconds(2500));
  CHECK(slow.find("upstream_error") != std::string::npos);  // the client still learns it broke
  CHECK(slow.ends_with("data: [DONE]\n\n\r\n0\r\n\r\n"));
  CHECK(router.replica(up.url()).at("circuit_breaker") == "closed");
  // The same break with a client that keeps up is the replica's fault.
  const std::string fast = slow_stream_read(router.port(), std::chrono::milliseconds(0));
  CHECK(fast.find("upstream_error") != std::string::npos);
  CHECK(router.replica(up.url()).at("circuit_breaker") == "open");
}

TEST_CASE("5,000 concurrent connections through the router are all served") {
  rlimit limit{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
  const rlim_t want = 16384;
  if (limit.rlim_cur < want && limit.rlim_max >= want) {
    limit.rlim_cur = want;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &limit) == 0);  // the router (a child) inherits it
  }
  if (limit.rlim_cur < want) {
    MESSAGE("SKIP: RLIMIT_NOFILE hard limit " << limit.rlim_max << " is below " << want);
    return;
  }
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.hang_ms = 1500;  // every request is held, so all connections are open at once
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "max_concurrency: 6000\nmax_queue: 100\nupstream_timeout_ms: 30000\n";
  }
  RouterProcess router({}, standin_flags({&up}, {"--config", (dir / "router.yaml").string()}));
  constexpr int kConnections = 5000;
  const long rss_before = router.rss_kib();
  asio::io_context io;
  int ok = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < kConnections; ++i) {
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      try {
        http::HttpClientConfig cc;
        cc.io_timeout = std::chrono::seconds(30);
        http::HttpClient client(co_await asio::this_coro::executor, cc);
        const std::string host = "127.0.0.1";
        co_await client.connect(host, router.port());
        http::Request r;
        r.method = "POST";
        r.target = "/v1/completions";
        r.body = kBody;
        r.headers.set("content-type", "application/json");
        const http::Response response = co_await client.request(r);
        ok += response.status == 200;
      } catch (const std::exception&) {
      }
    }, asio::detached);
  }
  io.run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const long rss_after = router.rss_kib();
  MESSAGE(kConnections << " concurrent connections: " << seconds << " s, at most " << up.max_in_flight.load()
                       << " held upstream at once, router RSS " << rss_before << " -> " << rss_after << " KiB");
  CHECK(ok == kConnections);
  CHECK(up.completion_requests() == kConnections);  // none sent twice
  CHECK(up.max_in_flight >= 4000);                  // they really were concurrent
  CHECK(seconds < 60);
}

}  // namespace kvfleet::test
