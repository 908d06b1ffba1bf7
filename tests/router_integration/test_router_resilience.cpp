// kvfleet-router in front of scripted stand-in replicas (standin_upstream.h): upstream keep-alive
// reuse, the transparent retry of a stale pooled connection, 503/429 retried on another replica,
// and the circuit breaker's open -> half-open -> closed cycle.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/time.h>

#include <fstream>

#include "router_fixture.h"
#include "standin_upstream.h"

namespace kvfleet::test {

namespace {

const std::string kBody = R"({"model":"tiny-qwen","prompt":"Hello there","max_tokens":2})";

std::string served_by(const http::Response& r) {
  const std::string* v = r.headers.find("x-kvfleet-replica");
  return v ? *v : "";
}

// Flags for a router in front of stand-ins: no KV events, health checks out of the way.
std::vector<std::string> standin_flags(const std::vector<const StandinUpstream*>& upstreams, std::vector<std::string> more) {
  std::vector<std::string> flags{"--kv-events", "false", "--health-interval-ms", "60000"};
  for (const auto* u : upstreams) {
    flags.push_back("--replica");
    flags.push_back(u->url());
  }
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

// One client connection reused for every request (HTTP keep-alive), as OpenAI clients do. The router
// reuses an upstream connection only for the client connection that used it before.
class KeepAliveClient {
 public:
  explicit KeepAliveClient(std::uint16_t port) : client_(io_.get_executor()) {
    run([&]() -> boost::asio::awaitable<void> {
      const std::string host = "127.0.0.1";
      co_await client_.connect(host, port);
    });
  }
  http::Response post(const std::string& target, const std::string& body) {
    http::Response out;
    run([&]() -> boost::asio::awaitable<void> {
      http::Request request;
      request.method = "POST";
      request.target = target;
      request.body = body;
      request.headers.set("content-type", "application/json");
      out = co_await client_.request(request);
    });
    return out;
  }

 private:
  template <typename Make>
  void run(Make make) {
    io_.restart();
    boost::asio::co_spawn(io_, make(), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
    io_.run();
  }
  boost::asio::io_context io_;
  http::HttpClient client_;
};

}  // namespace

TEST_CASE("upstream keep-alive: sequential requests share one upstream connection") {
  StandinUpstream up;
  RouterProcess router({}, standin_flags({&up}, {}));
  KeepAliveClient client(router.port());
  for (int i = 0; i < 20; ++i) REQUIRE(client.post("/v1/completions", kBody).status == 200);
  CHECK(up.completion_requests() == 20);
  CHECK(up.completion_connections() == 1);
  CHECK(router.metric("kvfleet_router_upstream_idle_connections") == 1);
  // Another client connection gets its own upstream connection.
  REQUIRE(router.post("/v1/completions", kBody).status == 200);
  CHECK(up.completion_connections() == 2);
}

TEST_CASE("upstream keep-alive off: a new connection per request") {
  StandinUpstream up;
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "upstream_keepalive: 0\n";
  }
  RouterProcess router({}, standin_flags({&up}, {"--config", (dir / "router.yaml").string()}));
  KeepAliveClient client(router.port());
  for (int i = 0; i < 5; ++i) REQUIRE(client.post("/v1/completions", kBody).status == 200);
  CHECK(up.completion_connections() == 5);
}

TEST_CASE("upstream keep-alive: a connection idle longer than upstream_idle_timeout_ms is not reused") {
  StandinUpstream up;
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "upstream_idle_timeout_ms: 200\n";
  }
  RouterProcess router({}, standin_flags({&up}, {"--config", (dir / "router.yaml").string()}));
  KeepAliveClient client(router.port());
  REQUIRE(client.post("/v1/completions", kBody).status == 200);
  REQUIRE(client.post("/v1/completions", kBody).status == 200);  // at once: reused
  CHECK(up.completion_connections() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  REQUIRE(client.post("/v1/completions", kBody).status == 200);
  CHECK(up.completion_connections() == 2);
}

TEST_CASE("a pooled connection closed by the replica is retried once on a new one, transparently") {
  StandinUpstream up;
  up.drop_reused = true;  // every reuse finds the connection closed, unanswered
  RouterProcess router({}, standin_flags({&up}, {}));
  KeepAliveClient client(router.port());
  for (int i = 0; i < 3; ++i) {
    const http::Response r = client.post("/v1/completions", kBody);
    REQUIRE(r.status == 200);
    CHECK(served_by(r) == up.url());
  }
  // 1: new connection. 2 and 3: the pooled one is dropped, then a new one answers.
  CHECK(up.completion_requests() == 5);
  CHECK(up.completion_connections() == 3);
  CHECK(router.metric("kvfleet_router_upstream_stale_retries_total") == 2);
  CHECK(router.metric("kvfleet_router_retries_total") == 0);  // not a retry on another replica
  CHECK(router.replica(up.url()).at("failure_streak") == 0);
  CHECK(router.replica(up.url()).at("healthy") == true);
}

TEST_CASE("503 and 429 before any byte reached the client are retried on another replica") {
  StandinUpstream busy, fine;
  busy.status = 503;
  RouterProcess router({}, standin_flags({&busy, &fine}, {"--policy", "round_robin"}));
  for (int i = 0; i < 6; ++i) {
    const http::Response r = router.post("/v1/completions", kBody);
    REQUIRE(r.status == 200);
    CHECK(served_by(r) == fine.url());
  }
  busy.status = 429;
  for (int i = 0; i < 4; ++i) REQUIRE(router.post("/v1/completions", kBody).status == 200);
  CHECK(busy.completion_requests() >= 2);  // round robin sent some there first
  CHECK(router.metric("kvfleet_router_retries_total") == busy.completion_requests());
  CHECK(router.metric("kvfleet_router_upstream_overloaded_total") == busy.completion_requests());
  CHECK(fine.completion_requests() == 10);
}

TEST_CASE("when every replica is overloaded, the client gets the replica's own 429") {
  StandinUpstream busy;
  busy.status = 429;
  RouterProcess router({}, standin_flags({&busy}, {}));
  const http::Response r = router.post("/v1/completions", kBody);
  CHECK(r.status == 429);
  CHECK(r.body == R"({"error":{"message":"standin"}})");
  CHECK(busy.completion_requests() == 1);  // one replica: nowhere else to go
}

TEST_CASE("circuit breaker: consecutive 500s open it, the cool-down half-opens it, a good probe closes it") {
  StandinUpstream broken, fine;
  broken.status = 500;
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "circuit_breaker:\n  consecutive_failures: 2\n  open_ms: 2000\n  half_open_probes: 1\n";
  }
  RouterProcess router({}, standin_flags({&broken, &fine}, {"--policy", "round_robin", "--config",
                                                            (dir / "router.yaml").string()}));
  for (int i = 0; i < 10 && broken.completion_requests() < 2; ++i) router.post("/v1/completions", kBody);
  REQUIRE(broken.completion_requests() == 2);
  CHECK(router.settled_replica(broken.url()).at("circuit_breaker") == "open");
  CHECK(router.metric("kvfleet_router_circuit_breaker_state", broken.url()) == 1);
  CHECK(router.metric("kvfleet_router_circuit_breaker_state", fine.url()) == 0);
  for (int i = 0; i < 4; ++i) CHECK(served_by(router.post("/v1/completions", kBody)) == fine.url());
  CHECK(broken.completion_requests() == 2);  // ejected: nothing more went there

  broken.status = 200;  // recovered; after the cool-down one probe goes there and closes the circuit
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  for (int i = 0; i < 4 && broken.completion_requests() == 2; ++i) router.post("/v1/completions", kBody);
  CHECK(broken.completion_requests() == 3);
  CHECK(router.settled_replica(broken.url()).at("circuit_breaker") == "closed");
  CHECK(router.metric("kvfleet_router_circuit_breaker_state", broken.url()) == 0);
}

TEST_CASE("an unknown circuit_breaker key fails at start, naming it") {
  TempDir dir;
  const auto model = make_router_model(dir);
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "model: " << model.string() << "\nreplicas: [http://127.0.0.1:1]\ncircuit_breaker: {open_sec: 3}\n";
  }
  const CommandResult r = run_command(bin_dir() + "/kvfleet-router --config " + (dir / "router.yaml").string() + " 2>&1");
  CHECK(r.status == 1);
  CHECK(r.out.find("'circuit_breaker.open_sec' is not a known setting") != std::string::npos);
}

}  // namespace kvfleet::test

namespace kvfleet::test {

namespace {

// One streamed completion over a raw socket: reads until `leave_after` bytes arrived (then hangs
// up, with a reset when `reset`) or to the end of the stream. Returns the bytes read.
std::string raw_stream(std::uint16_t port, std::size_t leave_after, bool reset) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return "connect failed: " + ec.message();
  const timeval limit{3, 0};  // a stream the router left hanging fails the test instead of hanging it
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  const std::string body = R"({"model":"tiny-qwen","prompt":"Hello there","max_tokens":64,"stream":true})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  asio::write(socket, asio::buffer(request), ec);
  std::string got;
  char buffer[4096];
  while (got.size() < leave_after) {
    // recv itself, not asio's read_some (which polls past SO_RCVTIMEO).
    const ssize_t n = ::recv(socket.native_handle(), buffer, sizeof buffer, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "timed out after " + got;
    if (n <= 0) break;
    got.append(buffer, n);
    if (got.find("0\r\n\r\n") != std::string::npos) break;  // the last chunk
  }
  if (reset) socket.set_option(asio::socket_base::linger(true, 0), ec);
  socket.close(ec);
  return got;
}

}  // namespace

// Clients hanging up at every point of a stream: closing the upstream connection from the
// disconnect callback must not pull the parser from under the relay's pending (or already
// completed, not yet run) read; and a spurious readiness of a client socket must not block an io
// thread in the disconnect watcher (which stalled a few streams per run on four threads).
TEST_CASE("clients leaving mid-stream: no crash, no stream left behind") {
  StandinUpstream up;
  up.stream_events = 60;
  RouterProcess router({}, standin_flags({&up}, {"--http-threads", "4"}));
  std::atomic<int> whole{0}, timed_out{0};
  std::mutex mutex;
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 30; ++i) {
        const int kind = (t + i) % 4;  // 0: reads to the end; 1-3: leaves after some bytes
        const std::size_t leave_after = kind == 0 ? SIZE_MAX : 1 + static_cast<std::size_t>((t * 131 + i * 977) % 3000);
        const std::string got = raw_stream(router.port(), leave_after, kind == 3);
        if (kind == 0 && got.find("data: [DONE]") != std::string::npos) ++whole;
        if (got.starts_with("timed out")) {
          ++timed_out;
          std::lock_guard lock(mutex);
          if (timed_out <= 3) MESSAGE("kind " << kind << " " << got.size() << " bytes: " << got.substr(0, 300));
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  CHECK(timed_out == 0);
  CHECK(whole == 60);  // every client that stayed got its whole stream
  // Every relay ended: no request still holds a slot or a replica's in-flight count.
  CHECK(wait_until([&] {
    const auto list = boost::json::parse(router.get("/admin/replicas").body).as_object();
    return list.at("active") == 0 && router.replica(up.url()).at("in_flight_requests") == 0;
  }, std::chrono::seconds(10)));
  const http::Response after = router.post("/v1/completions", R"({"model":"tiny-qwen","prompt":"x","max_tokens":2})");
  CHECK(after.status == 200);
  CHECK(after.body.find("data: [DONE]") != std::string::npos);
}

}  // namespace kvfleet::test
