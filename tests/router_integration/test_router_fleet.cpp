// The router at fleet scale, with real replica processes (and stand-ins for discovery): pending
// marks keep a group of concurrent requests on one replica; two routers in front of the same replicas
// place groups alike and decide alike from the same state; a router started late catches up through a
// snapshot; DNS discovery subscribes and drops replicas; replicas report their load.
#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>

#include "hardening_support.h"
#include "kvfleet/http/client.h"

namespace kvfleet::test {
namespace json = boost::json;
using hardening::served_by;

namespace {

const std::vector<std::string> kFleetReplicaFlags{"--num-kv-blocks", "256"};

// Group g's prompt: its own system prompt (~15 blocks of the tiny tokenizer) and question q.
std::string group_prompt(int g, int q) {
  std::string p = "System prompt of group " + std::to_string(g) + ":";
  for (int w = 0; w < 60; ++w) p += " rule" + std::to_string(g * 100 + w) + " applies";
  return p + ". Question " + std::to_string(q) + ": what now?";
}

std::string body(const std::string& prompt) {
  return json::serialize(json::object{{"model", "tiny-qwen"}, {"prompt", prompt}, {"max_tokens", 2}, {"ignore_eos", true}});
}

bool all_exact(const RouterProcess& router, const std::vector<const ReplicaProcess*>& replicas) {
  for (const auto* r : replicas)
    if (router.replica(r->base_url()).at("mode") != "exact") return false;
  return true;
}

// Runs `count` requests `width` at a time; request i goes where `send(i)` sends it and returns served_by.
std::vector<std::string> run_concurrently(int count, int width, const std::function<std::string(int)>& send) {
  std::vector<std::string> served(count);
  std::atomic<int> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < width; ++w)
    workers.emplace_back([&] {
      for (int i = next++; i < count; i = next++) served[i] = send(i);
    });
  for (auto& t : workers) t.join();
  return served;
}

double replicas_per_group(const std::vector<std::string>& served, int groups) {
  std::map<int, std::set<std::string>> by_group;
  for (std::size_t i = 0; i < served.size(); ++i) by_group[static_cast<int>(i) % groups].insert(served[i]);
  double sum = 0;
  for (const auto& [g, replicas] : by_group) sum += replicas.size();
  return sum / groups;
}

}  // namespace

TEST_CASE("exact mode: a group of concurrent requests with one new prefix lands on one replica") {
  ReplicaProcess a(kFleetReplicaFlags), b(kFleetReplicaFlags), c(kFleetReplicaFlags);
  RouterProcess router({&a, &b, &c});
  REQUIRE(wait_until([&] { return all_exact(router, {&a, &b, &c}); }, std::chrono::seconds(20)));
  // All eight are in flight together: no KV event can have told the router anything yet. Before the
  // pending marks they went to the least loaded replica each, i.e. all three.
  const std::vector<std::string> served = run_concurrently(8, 8, [&](int i) {
    const http::Response r = router.post("/v1/completions", body(group_prompt(1, i)));
    CHECK(r.status == 200);
    return served_by(r);
  });
  const std::set<std::string> used(served.begin(), served.end());
  CHECK_MESSAGE(used.size() == 1, "served by " << used.size() << " replicas");
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"cache_hit\"") >= 7);
  // The events confirm the pending marks.
  CHECK(wait_until([&] { return json::parse(router.get("/admin/replicas").body).at("tree").at("pending_confirmed").as_int64() > 0; },
                   std::chrono::seconds(10)));
}

TEST_CASE("two routers in front of the same replicas place and route groups alike; a late router catches up") {
  ReplicaProcess a(kFleetReplicaFlags), b(kFleetReplicaFlags), c(kFleetReplicaFlags);
  const std::vector<const ReplicaProcess*> replicas{&a, &b, &c};
  // Pure rendezvous for new prefixes (no load filter): the routers' placement cannot depend on timing.
  const std::vector<std::string> flags{"--new-prefix-slack", "1000"};
  RouterProcess one(replicas, flags), two(replicas, flags);
  REQUIRE(wait_until([&] { return all_exact(one, replicas) && all_exact(two, replicas); }, std::chrono::seconds(20)));
  constexpr int kGroups = 6, kPerGroup = 8;
  // Request i: group i % 6, its k-th request (k = i / 6) on router (k + group) % 2, six at a time.
  const std::vector<std::string> served = run_concurrently(kGroups * kPerGroup, 6, [&](int i) {
    const int g = i % kGroups, k = i / kGroups;
    const RouterProcess& router = (k + g) % 2 == 0 ? one : two;
    const http::Response r = router.post("/v1/completions", body(group_prompt(g, k)));
    CHECK(r.status == 200);
    return served_by(r);
  });
  const double spread = replicas_per_group(served, kGroups);
  MESSAGE("replicas per group over two routers: " << spread);
  CHECK(spread == doctest::Approx(1.0));

  // Same state, same decisions: once the events are in, both route every group's next prompt alike.
  auto settled = [&](const RouterProcess& r) {
    return json::parse(r.get("/admin/replicas").body).at("tree").at("pending_blocks").as_int64() == 0 ||
           r.metric("kvfleet_router_tree_entries") > 0;
  };
  REQUIRE(wait_until([&] { return settled(one) && settled(two); }, std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the last requests' events
  // A router started now has seen none of it: it asks since=0 and gets the replicas' snapshots.
  RouterProcess late(replicas, flags);
  REQUIRE(wait_until([&] { return all_exact(late, replicas); }, std::chrono::seconds(20)));
  for (const auto* r : replicas) {
    const json::object entry = late.replica(r->base_url());
    if (entry.at("last_seq").as_int64() > 0) CHECK(entry.at("snapshots").as_int64() >= 1);
  }
  for (int g = 0; g < kGroups; ++g) {
    const std::string prompt = group_prompt(g, 100);
    const std::string where_one = served_by(one.post("/v1/completions", body(prompt)));
    const std::string where_two = served_by(two.post("/v1/completions", body(prompt)));
    const std::string where_late = served_by(late.post("/v1/completions", body(prompt)));
    CHECK(where_one == served[g]);
    CHECK(where_two == where_one);
    CHECK(where_late == where_one);
  }
  CHECK(late.metric("kvfleet_router_decisions_total", "reason=\"cache_hit\"") == kGroups);
}

TEST_CASE("replicas report their load on the event stream; the router shows it") {
  ReplicaProcess a(kFleetReplicaFlags);
  RouterProcess router({&a});
  REQUIRE(wait_until([&] { return all_exact(router, {&a}); }, std::chrono::seconds(20)));
  REQUIRE(wait_until([&] { return router.replica(a.base_url()).at("reported_load").is_object(); }, std::chrono::seconds(10)));
  const json::object load = router.replica(a.base_url()).at("reported_load").as_object();
  CHECK(load.at("waiting").as_int64() == 0);
  CHECK(load.at("running").as_int64() == 0);
  // An older reader (no load=1) gets no load events: it would have taken them for bad JSON.
  boost::asio::io_context io;  // first: the coroutine frame left suspended in it goes before the rest
  http::HttpClientConfig cc;
  std::string seen;
  // A named lambda: the coroutine refers to its captures, which must outlive io.run_for.
  auto reader = [&]() -> boost::asio::awaitable<void> {
    http::HttpClient client(co_await boost::asio::this_coro::executor, cc);
    const std::string target = "/v1/kv_events?since=0";  // named: no temporaries in a co_await (GCC 12)
    const http::ResponseHead head = co_await open_get(client, a.port(), target);
    CHECK(head.status == 200);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(800);
    while (std::chrono::steady_clock::now() < until && seen.size() < 4096)
      if (auto piece = co_await client.read_some()) seen += *piece; else break;
  };
  boost::asio::co_spawn(io, reader(), [](std::exception_ptr) {});
  io.run_for(std::chrono::seconds(2));
  CHECK(seen.find("\"config\"") != std::string::npos);
  CHECK(seen.find("\"load\"") == std::string::npos);
}

TEST_CASE("DNS discovery: replicas behind one name are subscribed, and dropped when they leave it") {
  // Three stand-ins on one port and three loopback addresses, as a headless Service's pods would be.
  StandinUpstream first("127.0.0.2");
  const std::uint16_t port = first.port();
  StandinUpstream second("127.0.0.3", port), third("127.0.0.4", port);
  TempDir dir;
  const auto hosts = dir / "hosts";
  auto write_hosts = [&](const std::vector<std::string>& addresses) {
    std::ofstream out(hosts.string() + ".tmp");
    for (const auto& a : addresses) out << a << " replicas.kvfleet.test\n";
    out.close();
    std::filesystem::rename(hosts.string() + ".tmp", hosts);  // whole, as a resolver would see it
  };
  write_hosts({"127.0.0.2", "127.0.0.3"});
  RouterProcess router({}, {"--discovery-dns", "replicas.kvfleet.test:" + std::to_string(port), "--discovery-hosts-file",
                            hosts.string(), "--discovery-interval-ms", "100", "--health-interval-ms", "60000"});
  auto listed = [&] {
    std::set<std::string> urls;
    const json::value admin = json::parse(router.get("/admin/replicas").body);  // named: the loop reads into it
    for (const auto& r : admin.at("replicas").as_array())
      if (r.at("discovered").as_bool()) urls.insert(std::string(r.at("url").as_string()));
    return urls;
  };
  REQUIRE(wait_until([&] { return listed() == std::set<std::string>{first.url(), second.url()}; }, std::chrono::seconds(10)));
  for (int i = 0; i < 6; ++i) CHECK(router.post("/v1/completions", hardening::kBody).status == 200);
  CHECK(first.completion_requests() + second.completion_requests() == 6);
  CHECK(third.completion_requests() == 0);

  write_hosts({"127.0.0.3", "127.0.0.4"});  // one pod gone, one new
  REQUIRE(wait_until([&] { return listed() == std::set<std::string>{second.url(), third.url()}; }, std::chrono::seconds(10)));
  const int before = first.completion_requests();
  for (int i = 0; i < 6; ++i) CHECK(router.post("/v1/completions", hardening::kBody).status == 200);
  CHECK(first.completion_requests() == before);
  CHECK(second.completion_requests() + third.completion_requests() == 12 - before);

  // A lookup that fails keeps what was found (a DNS blip must not empty the fleet).
  std::filesystem::remove(hosts);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  CHECK(listed() == std::set<std::string>{second.url(), third.url()});
}

TEST_CASE("DNS discovery through the system resolver: localhost") {
  StandinUpstream local("127.0.0.1");
  RouterProcess router({}, {"--discovery-dns", "localhost:" + std::to_string(local.port()), "--discovery-interval-ms", "100"});
  REQUIRE(wait_until([&] {
    const json::value admin = json::parse(router.get("/admin/replicas").body);
    for (const auto& r : admin.at("replicas").as_array())
      if (r.at("url").as_string() == local.url() && r.at("healthy").as_bool()) return true;
    return false;
  }, std::chrono::seconds(10)));
  CHECK(router.post("/v1/completions", hardening::kBody).status == 200);
  CHECK(local.completion_requests() >= 1);
}

}  // namespace kvfleet::test
