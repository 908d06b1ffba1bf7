// The router's HTTP-side settings: connection caps, the header deadline, special tokens in content.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "router/gateway/router_config.h"

using namespace kvfleet::router;
using std::chrono::milliseconds;

namespace {

RouterConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "kvfleet-router");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_router_args(static_cast<int>(argv.size()), argv.data(), nullptr);
}

}  // namespace

TEST_CASE("router: connection caps and the header deadline as flags and YAML") {
  const RouterConfig defaults = parse({"--model", "/m"});
  CHECK(defaults.header_timeout == milliseconds(10'000));
  CHECK(defaults.header_timeout < defaults.read_timeout);
  CHECK(!defaults.max_connections_per_peer);  // half of the connection slots
  RouterConfig y;
  apply_router_yaml("header_timeout_ms: 1500\nmax_connections_per_peer: 0\nread_timeout_ms: 4000\n", "r.yaml", y);
  CHECK(y.header_timeout == milliseconds(1500));
  CHECK(y.read_timeout == milliseconds(4000));
  CHECK(y.max_connections_per_peer == std::optional<std::size_t>(0));
  CHECK_THROWS_WITH_AS(apply_router_yaml("max_connections_per_peer: many\n", "r.yaml", y),
                       doctest::Contains("max_connections_per_peer"), std::invalid_argument);
  const RouterConfig flags =
      parse({"--model", "/m", "--header-timeout-ms", "700", "--read-timeout-ms", "9000", "--max-connections-per-peer", "12"});
  CHECK(flags.header_timeout == milliseconds(700));
  CHECK(flags.read_timeout == milliseconds(9000));
  CHECK(flags.max_connections_per_peer == std::optional<std::size_t>(12));
  CHECK_THROWS_AS(parse({"--model", "/m", "--header-timeout-ms", "0"}), std::invalid_argument);
  const RouterConfig example = parse({"--config", std::string(KVFLEET_SOURCE_DIR) + "/examples/router.yaml"});
  CHECK(example.header_timeout == milliseconds(10'000));
  CHECK(!example.max_connections_per_peer);
}

TEST_CASE("router: special-token text in content is plain text unless --special-tokens-in-content") {
  CHECK(!parse({"--model", "/m"}).special_tokens_in_content);
  CHECK(parse({"--model", "/m", "--special-tokens-in-content"}).special_tokens_in_content);
  CHECK(!parse({"--model", "/m", "--no-special-tokens-in-content"}).special_tokens_in_content);
  RouterConfig y;
  apply_router_yaml("special_tokens_in_content: true\n", "r.yaml", y);
  CHECK(y.special_tokens_in_content);
  const RouterConfig example = parse({"--config", std::string(KVFLEET_SOURCE_DIR) + "/examples/router.yaml"});
  CHECK(!example.special_tokens_in_content);
}

TEST_CASE("router: the session header and session_from_user as flags and YAML") {
  const RouterConfig defaults = parse({"--model", "/m"});
  CHECK(defaults.session_header == "x-session-id");
  CHECK_FALSE(defaults.session_from_user);
  RouterConfig y;
  apply_router_yaml("session_header: x-conversation\nsession_from_user: true\n", "r.yaml", y);
  CHECK(y.session_header == "x-conversation");
  CHECK(y.session_from_user);
  CHECK_THROWS_WITH_AS(apply_router_yaml("session_from_user: sometimes\n", "r.yaml", y),
                       doctest::Contains("session_from_user"), std::invalid_argument);
  const RouterConfig flags = parse({"--model", "/m", "--session-header", "", "--session-from-user"});
  CHECK(flags.session_header.empty());
  CHECK(flags.session_from_user);
}
