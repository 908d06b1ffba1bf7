// Flow control in kvfleet-router (router/flow/fair_queue.h): tenants share the forwarding slots and the
// waiting room by weight, priority bands go in strict order, a tenant over its share gets 429 with
// Retry-After, and a replica schedules by the body's `priority` when started with --scheduling-policy
// priority. Against scripted stand-in replicas (the order they are asked in) and real replicas.
#include <doctest/doctest.h>

#include <fstream>
#include <thread>

#include "hardening_support.h"
#include "kvfleet/http/client.h"

namespace kvfleet::test {
namespace json = boost::json;
using namespace hardening;

namespace {

std::string body_for(const std::string& label, const std::string& extra = "") {
  return R"({"model":"tiny-qwen","prompt":")" + label + R"(","max_tokens":2)" + extra + "}";
}

http::Response post_as(std::uint16_t port, const std::string& tenant, const std::string& body,
                       const std::string& priority_header = "") {
  http::Headers h{{"Content-Type", "application/json"}};
  if (!tenant.empty()) h.add("x-kvfleet-tenant", tenant);
  if (!priority_header.empty()) h.add("x-kvfleet-priority", priority_header);
  return http::http_request("127.0.0.1", port, "POST", "/v1/completions", body, h, std::chrono::seconds(60));
}

std::int64_t queued(const RouterProcess& router) {
  return json::parse(router.get("/admin/replicas").body).at("queued").as_int64();
}

// The prompts the stand-in was asked for, in order.
std::vector<std::string> prompts_served(const StandinUpstream& up) {
  std::vector<std::string> out;
  for (const auto& b : up.completion_bodies()) out.push_back(std::string(json::parse(b).at("prompt").as_string()));
  return out;
}

// Requests sent one after another, each waiting until the previous one is queued, so their queue order
// is the order given. `statuses` gets each answer's status.
struct Senders {
  std::vector<std::thread> threads;
  std::vector<int> statuses;
  std::vector<std::string> retry_after;
  explicit Senders(std::size_t n) : statuses(n, 0), retry_after(n) {}
  void send(std::size_t i, std::uint16_t port, const std::string& tenant, const std::string& body,
            const std::string& priority_header = "") {
    threads.emplace_back([=, this] {
      const http::Response r = post_as(port, tenant, body, priority_header);
      statuses[i] = r.status;
      if (const std::string* a = r.headers.find("retry-after")) retry_after[i] = *a;
    });
  }
  ~Senders() {
    for (auto& t : threads) t.join();
  }
};

}  // namespace

TEST_CASE("flow control: a light tenant is served ahead of a flooding tenant's backlog, not behind it") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.hang_ms = 4000;  // the first request holds the one forwarding slot while the others queue
  RouterProcess router({}, standin_flags({&up}, {"--max-concurrency", "1", "--max-queue", "100"}));
  {
    Senders s(9);
    s.send(0, router.port(), "flood", body_for("flood-0"));
    REQUIRE(wait_until([&] { return up.in_flight > 0; }, std::chrono::seconds(10)));
    up.hang_ms = 50;  // the rest, once forwarded, go quickly
    for (int i = 1; i <= 7; ++i) {
      s.send(i, router.port(), "flood", body_for("flood-" + std::to_string(i)));
      REQUIRE(wait_until([&] { return queued(router) == i; }, std::chrono::seconds(10)));
    }
    s.send(8, router.port(), "light", body_for("light"));
    REQUIRE(wait_until([&] { return queued(router) == 8; }, std::chrono::seconds(10)));
  }
  const auto order = prompts_served(up);
  REQUIRE(order.size() == 9);
  CHECK(order[0] == "flood-0");
  // First come, first served would ask for it last; fair sharing at once (the flood has had its grant).
  CHECK(order[1] == "light");
  CHECK(router.metric("kvfleet_router_tenant_requests_total", "outcome=\"admitted\",tenant=\"light\"") == 1);
  CHECK(router.metric("kvfleet_router_tenant_requests_total", "outcome=\"admitted\",tenant=\"flood\"") == 8);
}

TEST_CASE("flow control: a tenant active a moment ago keeps its share of the slots; a flood cannot take them all") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  RouterProcess router({}, standin_flags({&up}, {"--max-concurrency", "4", "--tenant-idle-ms", "60000"}));
  REQUIRE(post_as(router.port(), "light", body_for("light-0")).status == 200);  // light is active from now on
  up.hang_ms = 4000;
  Senders s(6);
  for (int i = 0; i < 6; ++i) s.send(i, router.port(), "flood", body_for("flood-" + std::to_string(i)));
  // Two tenants active: the flood holds at most its half of the four slots, the rest of it waits.
  REQUIRE(wait_until([&] { return queued(router) == 4; }, std::chrono::seconds(10)));
  CHECK(up.in_flight.load() == 2);
  up.hang_ms = 0;
  const auto sent = std::chrono::steady_clock::now();
  CHECK(post_as(router.port(), "light", body_for("light-1")).status == 200);
  CHECK(std::chrono::steady_clock::now() - sent < std::chrono::milliseconds(3000));  // not behind the flood's 4 s
  CHECK(queued(router) == 4);
  CHECK(up.max_in_flight.load() == 3);
}

TEST_CASE("flow control: weights share the slots; a lower priority band goes first, from the body or the header") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.hang_ms = 4000;
  RouterProcess router({}, standin_flags({&up}, {"--max-concurrency", "1", "--tenant-weight", "gold=3"}));
  {
    Senders s(12);
    s.send(0, router.port(), "bronze", body_for("hold"));
    REQUIRE(wait_until([&] { return up.in_flight > 0; }, std::chrono::seconds(10)));
    up.hang_ms = 50;
    std::size_t i = 1;
    for (int k = 0; k < 4; ++k) {
      s.send(i, router.port(), "bronze", body_for("bronze-" + std::to_string(k)));
      REQUIRE(wait_until([&] { return queued(router) == static_cast<std::int64_t>(i); }, std::chrono::seconds(10)));
      ++i;
      s.send(i, router.port(), "gold", body_for("gold-" + std::to_string(k)));
      REQUIRE(wait_until([&] { return queued(router) == static_cast<std::int64_t>(i); }, std::chrono::seconds(10)));
      ++i;
    }
    s.send(i, router.port(), "bronze", body_for("urgent-body", R"(,"priority":-5)"));
    REQUIRE(wait_until([&] { return queued(router) == static_cast<std::int64_t>(i); }, std::chrono::seconds(10)));
    ++i;
    s.send(i, router.port(), "bronze", body_for("urgent-header"), "-1");
    REQUIRE(wait_until([&] { return queued(router) == static_cast<std::int64_t>(i); }, std::chrono::seconds(10)));
    ++i;
    s.send(i, router.port(), "bronze", body_for("late"), "7");
    REQUIRE(wait_until([&] { return queued(router) == static_cast<std::int64_t>(i); }, std::chrono::seconds(10)));
  }
  const auto order = prompts_served(up);
  REQUIRE(order.size() == 12);
  CHECK(order[1] == "urgent-body");    // band -5
  CHECK(order[2] == "urgent-header");  // band -1
  CHECK(order[11] == "late");          // band 7, after all of band 0
  // Band 0, gold at weight 3 against bronze at 1: of the first four grants there, three go to gold.
  int gold = 0;
  for (int k = 3; k < 7; ++k) gold += order[k].rfind("gold", 0) == 0;
  CHECK(gold == 3);
}

TEST_CASE("flow control: a full waiting room refuses the tenant over its share (429, Retry-After), not the other") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.hang_ms = 4000;
  RouterProcess router({}, standin_flags({&up}, {"--max-concurrency", "1", "--max-queue", "4"}));
  Senders s(7);
  s.send(0, router.port(), "flood", body_for("flood-0"));
  REQUIRE(wait_until([&] { return up.in_flight > 0; }, std::chrono::seconds(10)));
  up.hang_ms = 50;
  for (int i = 1; i <= 4; ++i) {
    s.send(i, router.port(), "flood", body_for("flood-" + std::to_string(i)));
    REQUIRE(wait_until([&] { return queued(router) == i; }, std::chrono::seconds(10)));
  }
  // The room is full and holds only the flood: its next request is refused at once ...
  const http::Response refused = post_as(router.port(), "flood", body_for("flood-5"));
  CHECK(refused.status == 429);
  REQUIRE(refused.headers.find("retry-after"));
  const int after = std::stoi(*refused.headers.find("retry-after"));
  CHECK(after >= 1);
  CHECK(after <= 60);
  CHECK(refused.body.find("flood") != std::string::npos);
  // ... and another tenant's takes the place of the flood's newest waiter, which gets the 429.
  s.send(5, router.port(), "light", body_for("light"));
  s.threads.back().join();
  s.threads.pop_back();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  CHECK(s.statuses[5] == 200);
  CHECK(s.statuses[4] == 429);  // flood-4, the newest, was pushed out
  CHECK(!s.retry_after[4].empty());
  for (int i = 0; i < 4; ++i) CHECK(s.statuses[i] == 200);
  CHECK(router.metric("kvfleet_router_tenant_requests_total", "outcome=\"rejected\",tenant=\"flood\"") == 2);
  CHECK(router.metric("kvfleet_router_tenant_requests_total", "outcome=\"rejected\",tenant=\"light\"") == 0);
}

TEST_CASE("flow control: a malformed tenant or priority is a 400 naming it; API keys are the tenants") {
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  {
    RouterProcess router({}, standin_flags({&up}, {}));
    const http::Response tenant = post_as(router.port(), "has space", kBody);
    CHECK(tenant.status == 400);
    CHECK(json::parse(tenant.body).at("error").at("param") == "x-kvfleet-tenant");
    const http::Response header = post_as(router.port(), "", kBody, "soon");
    CHECK(header.status == 400);
    CHECK(json::parse(header.body).at("error").at("param") == "x-kvfleet-priority");
    for (const char* bad : {R"("high")", "1.5", "4294967296"}) {
      const http::Response body = post_as(router.port(), "", body_for("x", std::string(R"(,"priority":)") + bad));
      CHECK(body.status == 400);
      CHECK(json::parse(body.body).at("error").at("param") == "priority");
    }
    CHECK(up.completion_requests() == 0);
  }
  RouterProcess keyed({}, standin_flags({&up}, {"--api-key", "alpha", "--api-key", "beta"}));
  CHECK(request(keyed.port(), "POST", "/v1/completions", kBody, "beta").status == 200);
  // With keys, the key names the tenant (its place in the list), whatever header the client sends.
  http::Headers h{{"Content-Type", "application/json"}, {"Authorization", "Bearer alpha"}, {"x-kvfleet-tenant", "beta"}};
  CHECK(http::http_request("127.0.0.1", keyed.port(), "POST", "/v1/completions", kBody, h, std::chrono::seconds(30)).status == 200);
  CHECK(keyed.metric("kvfleet_router_tenant_requests_total", "outcome=\"admitted\",tenant=\"key-2\"") == 1);
  CHECK(keyed.metric("kvfleet_router_tenant_requests_total", "outcome=\"admitted\",tenant=\"key-1\"") == 1);
  CHECK(keyed.get("/metrics").body.find("tenant=\"beta\"") == std::string::npos);
}

TEST_CASE("a replica schedules by the body's priority only when started with --scheduling-policy priority") {
  ReplicaProcess fcfs({"--num-kv-blocks", "96"});
  const http::Response refused = fcfs.post("/v1/completions", body_for("Hi", R"(,"priority":3)"));
  CHECK(refused.status == 400);
  CHECK(json::parse(refused.body).at("error").at("param") == "priority");
  CHECK(fcfs.post("/v1/completions", body_for("Hi", R"(,"priority":0)")).status == 200);
  ReplicaProcess prio({"--num-kv-blocks", "96", "--scheduling-policy", "priority"});
  CHECK(prio.post("/v1/completions", body_for("Hi", R"(,"priority":3)")).status == 200);
  const http::Response bad = prio.post("/v1/completions", body_for("Hi", R"(,"priority":"3")"));
  CHECK(bad.status == 400);
  CHECK(json::parse(bad.body).at("error").at("param") == "priority");
}

}  // namespace kvfleet::test
