// examples/grafana/kvfleet-fleet.json against Grafana's dashboard schema types and against the metrics a
// real router and replica export (scripts/grafana/check.mjs): the replica runs a host KV tier and n-gram
// speculation so that those families exist, and serves requests that fill the histograms.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "router_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;

TEST_CASE("grafana: every panel's metrics exist on a live fleet and the dashboard passes Grafana's schema") {
  const std::string modules = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm-manifests/node_modules";
  const std::string no_modules = "no @grafana/schema or typescript in " + modules + ": run scripts/setup";
  REQUIRE_MESSAGE(std::filesystem::exists(modules + "/@grafana/schema"), no_modules);
  REQUIRE_MESSAGE(std::filesystem::exists(modules + "/typescript"), no_modules);
  ReplicaProcess replica({"--kv-host-gib", "0.01", "--speculative-config",
                          R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3})"});
  RouterProcess router({&replica});
  std::string prompt = "one two three four one two three four";
  for (int i = 0; i < 6; ++i) prompt += " one two three four";
  const std::string body =
      R"({"model":"tiny-qwen","max_tokens":8,"stream":true,"ignore_eos":true,"prompt":")" + prompt + "\"}";
  for (int i = 0; i < 3; ++i) REQUIRE(router.post("/v1/completions", body).status == 200);

  TempDir dir;
  const auto save = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const std::string router_metrics = save("router.txt", router.get("/metrics").body);
  const std::string replica_metrics = save("replica.txt", replica.get("/metrics").body);
  const std::string dashboard = std::string(KVFLEET_SOURCE_DIR) + "/examples/grafana/kvfleet-fleet.json";
  const std::string check = std::string(KVFLEET_SOURCE_DIR) + "/scripts/grafana/check.mjs --source " +
                            KVFLEET_SOURCE_DIR + "/engine --source " + KVFLEET_SOURCE_DIR + "/router";
  const auto run_check = [&](const std::string& file) {
    return run_command("NODE_PATH=" + modules + " node " + check + " " + file + " " + router_metrics + " " +
                       replica_metrics + " 2>&1");
  };
  const auto r = run_check(dashboard);
  CHECK_MESSAGE(r.status == 0, r.out);
  CHECK(r.out.find("[check-grafana] ok: 29 panels") == 0);

  // The check fails on a dashboard that names a metric nobody exports, or breaks the schema.
  std::ifstream in(dashboard);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string bad_metric = text;
  bad_metric.replace(bad_metric.find("kvfleet_router_replica_healthy"), 30, "kvfleet_router_replica_healthz");
  const auto r1 = run_check(save("bad1.json", bad_metric));
  CHECK(r1.status == 1);
  CHECK(r1.out.find("kvfleet_router_replica_healthz is not exported") != std::string::npos);
  std::string bad_schema = text;
  bad_schema.replace(bad_schema.find("\"graphTooltip\": 1"), 17, "\"graphTooltip\": \"shared\"");
  const auto r2 = run_check(save("bad2.json", bad_schema));
  CHECK(r2.status == 1);
  CHECK(r2.out.find("schema: ") != std::string::npos);
}
