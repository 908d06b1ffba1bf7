// kvfleet-router in front of scripted stand-in replicas (standin_upstream.h): upstream keep-alive
// reuse, the transparent retry of a stale pooled connection, 503/429 retried on another replica,
// and the circuit breaker's open -> half-open -> closed cycle.
#include <doctest/doctest.h>

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

}  // namespace

TEST_CASE("upstream keep-alive: sequential requests share one upstream connection") {
  StandinUpstream up;
  RouterProcess router({}, standin_flags({&up}, {}));
  for (int i = 0; i < 20; ++i) REQUIRE(router.post("/v1/completions", kBody).status == 200);
  CHECK(up.completion_requests() == 20);
  CHECK(up.completion_connections() == 1);
  CHECK(router.metric("kvfleet_router_upstream_idle_connections") == 1);
}

TEST_CASE("upstream keep-alive off: a new connection per request") {
  StandinUpstream up;
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    yaml << "upstream_keepalive: 0\n";
  }
  RouterProcess router({}, standin_flags({&up}, {"--config", (dir / "router.yaml").string()}));
  for (int i = 0; i < 5; ++i) REQUIRE(router.post("/v1/completions", kBody).status == 200);
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
  REQUIRE(router.post("/v1/completions", kBody).status == 200);
  REQUIRE(router.post("/v1/completions", kBody).status == 200);  // at once: reused
  CHECK(up.completion_connections() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  REQUIRE(router.post("/v1/completions", kBody).status == 200);
  CHECK(up.completion_connections() == 2);
}

TEST_CASE("a pooled connection closed by the replica is retried once on a new one, transparently") {
  StandinUpstream up;
  up.drop_reused = true;  // every reuse finds the connection closed, unanswered
  RouterProcess router({}, standin_flags({&up}, {}));
  for (int i = 0; i < 3; ++i) {
    const http::Response r = router.post("/v1/completions", kBody);
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
  CHECK(router.replica(broken.url()).at("circuit_breaker") == "open");
  CHECK(router.metric("kvfleet_router_circuit_breaker_state", broken.url()) == 1);
  CHECK(router.metric("kvfleet_router_circuit_breaker_state", fine.url()) == 0);
  for (int i = 0; i < 4; ++i) CHECK(served_by(router.post("/v1/completions", kBody)) == fine.url());
  CHECK(broken.completion_requests() == 2);  // ejected: nothing more went there

  broken.status = 200;  // recovered; after the cool-down one probe goes there and closes the circuit
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  for (int i = 0; i < 4 && broken.completion_requests() == 2; ++i) router.post("/v1/completions", kBody);
  CHECK(broken.completion_requests() == 3);
  CHECK(router.replica(broken.url()).at("circuit_breaker") == "closed");
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
