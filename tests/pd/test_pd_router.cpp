// Router pd mode: the decider (router/gateway/pd_routing.h), its settings, and a real router in front of
// a decode and a prefill replica: long uncached prompts are disaggregated, short or cached ones are not,
// the answers equal a mixed replica's, and the decisions are counted by reason.
#include <doctest/doctest.h>

#include "pd/pd_test_util.h"
#include "router/gateway/pd_routing.h"
#include "router/gateway/router_config.h"
#include "router_integration/router_fixture.h"

using namespace kvfleet;
using namespace kvfleet::router;
using kvfleet::test::ReplicaProcess;
using kvfleet::test::RouterProcess;

TEST_CASE("the pd decider: threshold first, then most matched, then least loaded") {
  const std::vector<PrefillCandidate> pool{{0, true, 1, 5}, {1, true, 3, 9}, {2, true, 3, 2}, {3, false, 8, 0}};
  CHECK_FALSE(choose_prefill(64, 64, pool).prefill);
  CHECK(std::string(choose_prefill(64, 64, pool).reason) == "below_threshold");
  const PdChoice c = choose_prefill(65, 64, pool);
  REQUIRE(c.prefill);
  CHECK(*c.prefill == 2);  // 3 matched blocks like 1, fewer in flight; 3 is unavailable
  CHECK(std::string(c.reason) == "disaggregated");
  const std::vector<PrefillCandidate> down{{0, false, 0, 0}};
  CHECK(std::string(choose_prefill(1000, 0, down).reason) == "no_prefill_replica");
  CHECK_FALSE(choose_prefill(1000, 0, {}).prefill);
}

TEST_CASE("pd pools and threshold from flags and YAML") {
  const char* argv[] = {"kvfleet-router", "--model", "m", "--decode-replica", "http://127.0.0.1:1", "--decode-replica",
                        "http://127.0.0.1:2", "--prefill-replica", "http://127.0.0.1:3", "--pd-threshold", "256"};
  const RouterConfig c = parse_router_args(11, argv, nullptr);
  CHECK(c.decode_replicas.size() == 2);
  CHECK(c.prefill_replicas == std::vector<std::string>{"http://127.0.0.1:3"});
  CHECK(c.pd_threshold == 256);
  RouterConfig y;
  apply_router_yaml("prefill_replicas: [\"http://a:1\"]\ndecode_replicas: [\"http://b:2\"]\npd_threshold: 8\n", "r.yaml", y);
  CHECK(y.prefill_replicas.size() == 1);
  CHECK(y.pd_threshold == 8);
  const char* lonely[] = {"kvfleet-router", "--model", "m", "--decode-replica", "http://127.0.0.1:1"};
  CHECK_THROWS_AS(parse_router_args(5, lonely, nullptr), std::invalid_argument);
  const char* bad[] = {"kvfleet-router", "--model", "m", "--prefill-replica", "nope"};
  CHECK_THROWS_AS(parse_router_args(5, bad, nullptr), std::invalid_argument);
}

TEST_CASE("a pd router sends long uncached prompts through a prefill replica and short ones straight to decode") {
  ReplicaProcess p({"--role", "prefill"}), d({"--role", "decode"}), m({"--role", "mixed"});
  RouterProcess router({}, {"--decode-replica", d.base_url(), "--prefill-replica", p.base_url(), "--pd-threshold", "32"});
  const std::string long_body = test::completion_body(test::prompt_ids(500, 100), 4);
  const std::string short_body = test::completion_body(test::prompt_ids(501, 30), -1);
  CHECK(test::answer_of(router.post("/v1/completions", long_body)) == test::answer_of(m.post("/v1/completions", long_body)));
  CHECK(test::metric_value(d.port(), "kvfleet_pd_transfers_total") == 1);
  CHECK(test::answer_of(router.post("/v1/completions", short_body)) == test::answer_of(m.post("/v1/completions", short_body)));
  // D now holds the long prompt (its KV events say so): what it lacks is under the threshold.
  CHECK(test::wait_until([&] { return router.replica(d.base_url()).at("events_applied").as_int64() > 0; },
                         std::chrono::seconds(5)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(test::answer_of(router.post("/v1/completions", long_body)) == test::answer_of(m.post("/v1/completions", long_body)));
  CHECK(test::metric_value(d.port(), "kvfleet_pd_transfers_total") == 1);
  CHECK(router.metric("kvfleet_router_pd_decisions_total", "reason=\"disaggregated\"") == 1);
  CHECK(router.metric("kvfleet_router_pd_decisions_total", "reason=\"below_threshold\"") == 2);
  // The prefill replica served no completion itself.
  CHECK(p.get("/metrics").body.find("path=\"/v1/completions\"") == std::string::npos);
  test::check_no_leak(p.port());
  test::check_no_leak(d.port());
}

TEST_CASE("mixed replicas serve in both pools: as the prefill replica of a decode replica, and as a decode replica") {
  ReplicaProcess m({"--role", "mixed"}), d({"--role", "decode"}), p({"--role", "prefill"}), ref({"--role", "mixed"});
  std::vector<std::string> bodies;
  for (int i = 0; i < 4; ++i) bodies.push_back(test::completion_body(test::prompt_ids(600 + i, 80), i % 2 == 0 ? -1 : 9));
  {
    // Decode pool {D, M} taken in turn; the prefill pool is M alone (no dedicated prefill replica): D's
    // requests are prefilled by M, M's own prefill locally (no other prefill replica than itself).
    RouterProcess router({&m}, {"--decode-replica", d.base_url(), "--pd-threshold", "32", "--policy", "round_robin"});
    for (const std::string& body : bodies)
      CHECK(test::answer_of(router.post("/v1/completions", body)) == test::answer_of(ref.post("/v1/completions", body)));
    CHECK(router.metric("kvfleet_router_pd_decisions_total", "reason=\"disaggregated\"") == 2);
    CHECK(router.metric("kvfleet_router_pd_decisions_total", "reason=\"no_prefill_replica\"") == 2);
    CHECK(test::metric_value(d.port(), "kvfleet_pd_transfers_total") == 2);  // from M, the only prefill replica
    CHECK(test::metric_value(m.port(), "kvfleet_pd_transfers_total") == 0);
    CHECK(m.get("/metrics").body.find("path=\"/v1/completions\"") != std::string::npos);  // M decoded its share
  }
  {
    // M is the whole decode pool beside a prefill replica: it decodes with the KV from P.
    std::vector<std::string> fresh;
    for (int i = 0; i < 2; ++i) fresh.push_back(test::completion_body(test::prompt_ids(700 + i, 80), -1));
    RouterProcess router({&m}, {"--prefill-replica", p.base_url(), "--pd-threshold", "32"});
    for (const std::string& body : fresh)
      CHECK(test::answer_of(router.post("/v1/completions", body)) == test::answer_of(ref.post("/v1/completions", body)));
    CHECK(router.metric("kvfleet_router_pd_decisions_total", "reason=\"disaggregated\"") == 2);
    CHECK(test::metric_value(m.port(), "kvfleet_pd_transfers_total") == 2);  // from P
  }
  for (const ReplicaProcess* r : {&m, &d, &p}) test::check_no_leak(r->port());
}
