// The router's live fleet page (/dashboard) with real replica processes: served self-contained, its data
// behind the admin key, and in a real headless Chromium it shows a replica going down and coming back
// (dashboard_browser.mjs).
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <string>

#include "router_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;
namespace json = boost::json;

TEST_CASE("dashboard: a self-contained page; the admin API feeds it hit ratios and recent errors") {
  ReplicaProcess a, b;
  RouterProcess router({&a, &b}, {"--admin-api-key", "dash-key", "--health-interval-ms", "300",
                                  "--health-timeout-ms", "300"});
  // Several blocks long, so that the router counts its blocks towards the chosen replica's hit ratio.
  std::string prompt = "Hello there, dashboard.";
  for (int i = 0; i < 10; ++i) prompt += " Line " + std::to_string(i) + " of a prompt that spans blocks.";
  const std::string body = R"({"model":"tiny-qwen","max_tokens":2,"prompt":")" + prompt + "\"}";
  for (int i = 0; i < 3; ++i) REQUIRE(router.post("/v1/completions", body).status == 200);

  const http::Response page = router.get("/dashboard");
  REQUIRE(page.status == 200);
  CHECK(page.headers.find("Content-Type")->find("text/html") == 0);
  CHECK(page.headers.find("Content-Security-Policy")->find("default-src 'none'") != std::string::npos);
  CHECK(page.body.find("<title>kvfleet router</title>") != std::string::npos);
  for (const char* external : {"src=\"http", "href=\"http", "src='http", "href='http", "@import", "url(http"})
    CHECK_MESSAGE(page.body.find(external) == std::string::npos, external);

  CHECK(router.get("/admin/replicas").status == 401);  // the page's data needs the key
  router.set_admin_key("dash-key");
  json::value fleet = json::parse(router.get("/admin/replicas").body);
  REQUIRE(fleet.at("replicas").as_array().size() == 2);
  double routed = 0;
  for (const auto& r : fleet.at("replicas").as_array()) {
    routed += r.at("routed").to_number<double>();
    if (r.at("routed").to_number<double>() > 0) {
      REQUIRE(r.at("prefix_hit_ratio").is_double());
      CHECK(r.at("prefix_hit_ratio").as_double() >= 0);
      CHECK(r.at("prefix_hit_ratio").as_double() <= 1);
    } else {
      CHECK(r.at("prefix_hit_ratio").is_null());
    }
  }
  CHECK(routed == 3);
  CHECK(fleet.at("recent_errors").as_array().empty());

  // A replica stopped: the health checks take it out, and the recent errors say so.
  ::kill(a.process().pid(), SIGSTOP);
  const bool down = wait_until([&] {
    fleet = json::parse(router.get("/admin/replicas").body);
    for (const auto& e : fleet.at("recent_errors").as_array())
      if (e.at("replica").as_string() == a.base_url() && e.at("what").as_string().starts_with("down")) return true;
    return false;
  }, std::chrono::seconds(10));
  ::kill(a.process().pid(), SIGCONT);
  CHECK(down);
}

TEST_CASE("dashboard: in a real headless Chromium, a replica going down and coming back") {
  const std::string chromium = getenv("KVFLEET_CHROMIUM") ? getenv("KVFLEET_CHROMIUM") : "/usr/bin/chromium";
  const std::string npm = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm";
  const std::string no_chromium = "no " + chromium + ": run scripts/setup (it installs Debian's chromium)";
  REQUIRE_MESSAGE(std::filesystem::exists(chromium), no_chromium);
  REQUIRE_MESSAGE(std::filesystem::exists(npm + "/node_modules/playwright-core"), "no playwright-core: run scripts/setup");
  ReplicaProcess a, b;
  RouterProcess router({&a, &b}, {"--admin-api-key", "dash-key", "--health-interval-ms", "300",
                                  "--health-timeout-ms", "300"});
  const std::string body = R"({"model":"tiny-qwen","prompt":"Hello there, dashboard","max_tokens":2})";
  for (int i = 0; i < 2; ++i) REQUIRE(router.post("/v1/completions", body).status == 200);
  const std::string base = "http://127.0.0.1:" + std::to_string(router.port());
  const auto r = run_command("KVFLEET_NPM=" + npm + " KVFLEET_CHROMIUM=" + chromium + " node " + KVFLEET_SOURCE_DIR +
                             "/tests/router_integration/dashboard_browser.mjs " + base + " dash-key " + a.base_url() +
                             " " + std::to_string(a.process().pid()) + " 2 2>&1");
  CHECK_MESSAGE(r.status == 0, r.out);
  CHECK(r.out == "ok\n");
}
