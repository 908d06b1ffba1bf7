// Tier-aware routing with real replica processes that keep KV tiers below their device pools: a prefix the
// device pool evicted into a replica's host tier keeps going to that replica, not to a cold one (also for a
// router that learns it from the snapshot opening its event stream), and a prefix
// in a shared tier is routable to every replica that mounts it (the router learns who mounts what from the
// replicas' config events).
#include <doctest/doctest.h>

#include <xxhash.h>

#include <regex>
#include <thread>

#include "hardening_support.h"
#include "kvfleet/block_hash.h"

namespace kvfleet::test {
namespace json = boost::json;
using hardening::served_by;

namespace {

constexpr std::uint64_t kBlock = 16;

// A prompt of `blocks` full blocks of token ids (plus one token), its ids drawn from `seed`.
std::vector<TokenId> token_prompt(int seed, int blocks) {
  std::vector<TokenId> t;
  for (int i = 0; i < blocks * static_cast<int>(kBlock) + 1; ++i) t.push_back(1000 + (seed * 7919 + i * 31) % 20000);
  return t;
}

std::string body(const std::vector<TokenId>& prompt, int max_tokens = 4) {
  json::array ids;
  for (const TokenId t : prompt) ids.emplace_back(t);
  return json::serialize(json::object{{"model", "tiny-qwen"}, {"prompt", ids}, {"max_tokens", max_tokens},
                                      {"temperature", 0}, {"ignore_eos", true}});
}

// cache_aware's placement of a prefix nobody holds (rendezvous over the replicas' URLs).
std::string rendezvous(const std::vector<TokenId>& prompt, const std::vector<std::string>& urls) {
  const auto hashes = block_hashes(block_hash_root("tiny-qwen"), prompt, kBlock);
  const BlockHash key = hashes[std::min<std::size_t>(8, hashes.size()) - 1];
  std::string best;
  std::uint64_t best_weight = 0;
  for (const auto& u : urls) {
    const std::uint64_t w = XXH3_64bits_withSeed(u.data(), u.size(), key);
    if (best.empty() || w > best_weight) best = u, best_weight = w;
  }
  return best;
}

// A prompt that rendezvous places on `url` (so that only the tier marks can send it elsewhere).
std::vector<TokenId> prompt_placed_on(const std::string& url, const std::vector<std::string>& urls, int blocks) {
  for (int seed = 1;; ++seed)
    if (auto p = token_prompt(seed, blocks); rendezvous(p, urls) == url) return p;
}

std::int64_t tier_blocks(const RouterProcess& router, const ReplicaProcess& r, const char* medium) {
  return router.replica(r.base_url()).at("tier_blocks").at(medium).as_int64();
}

std::int64_t cached_tokens(const http::Response& r) {
  return json::parse(r.body).at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
}

std::string text(const http::Response& r) { return json::serialize(json::parse(r.body).at("choices")); }

// The newest seq of r's KV events (its stream's config event), and a wait until `router` applied it.
std::uint64_t newest_seq(const ReplicaProcess& r) {
  const std::string events = read_events(r.port(), {R"("type":"config")"}, 5);
  std::smatch m;
  REQUIRE(std::regex_search(events, m, std::regex(R"("type":"config","seq":([0-9]+))")));
  return std::stoull(m[1]);
}

bool caught_up(const RouterProcess& router, const ReplicaProcess& r) {
  const std::uint64_t seq = newest_seq(r);
  return wait_until([&] { return router.replica(r.base_url()).at("last_seq").to_number<std::uint64_t>() >= seq; },
                    std::chrono::seconds(10));
}

bool all_exact(const RouterProcess& router, const std::vector<const ReplicaProcess*>& replicas) {
  for (const auto* r : replicas)
    if (router.replica(r->base_url()).at("mode") != "exact") return false;
  return true;
}

}  // namespace

TEST_CASE("a prefix evicted into a replica's host tier is routed to it over a cold replica") {
  // 24 device blocks: two 20-block prompts evict a 10-block one; the host tier takes what the pool evicts.
  const std::vector<std::string> flags{"--num-kv-blocks", "24", "--kv-host-gib", "0.05"};
  ReplicaProcess a(flags), b(flags);
  RouterProcess router({&a, &b});
  REQUIRE(wait_until([&] { return all_exact(router, {&a, &b}); }, std::chrono::seconds(20)));
  const std::vector<std::string> urls{a.base_url(), b.base_url()};
  // Without tier marks the router would place this prompt on b (nobody holds it on a device).
  const std::vector<TokenId> prompt = prompt_placed_on(b.base_url(), urls, 10);

  const http::Response first = a.post("/v1/completions", body(prompt));  // a computes it, directly
  REQUIRE_MESSAGE(first.status == 200, first.body);
  for (int seed : {90001, 90002}) REQUIRE(a.post("/v1/completions", body(token_prompt(seed, 20), 2)).status == 200);
  REQUIRE(caught_up(router, a));
  CHECK(tier_blocks(router, a, "host") >= 10);
  CHECK(tier_blocks(router, b, "host") == 0);

  const http::Response again = router.post("/v1/completions", body(prompt));
  REQUIRE_MESSAGE(again.status == 200, again.body);
  CHECK(served_by(again) == a.base_url());
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"tier_hit\"") == 1);
  CHECK(cached_tokens(again) == 10 * static_cast<std::int64_t>(kBlock));  // from a's host tier
  CHECK(text(again) == text(first));

  // Back on a's device since `again`: two more long prompts evict it into the host tier again. A router
  // started now learns a's host tier from the snapshot that opens its event stream.
  for (int seed : {90003, 90004}) REQUIRE(a.post("/v1/completions", body(token_prompt(seed, 20), 2)).status == 200);
  RouterProcess late({&a, &b});
  REQUIRE(wait_until([&] { return all_exact(late, {&a, &b}); }, std::chrono::seconds(20)));
  REQUIRE(caught_up(late, a));
  CHECK(late.replica(a.base_url()).at("snapshots").as_int64() >= 1);
  CHECK(tier_blocks(late, a, "host") >= 10);
  const http::Response from_snapshot = late.post("/v1/completions", body(prompt));
  CHECK(served_by(from_snapshot) == a.base_url());
  CHECK(late.metric("kvfleet_router_decisions_total", "reason=\"tier_hit\"") == 1);
  CHECK(text(from_snapshot) == text(first));

  // With the tier weights at 0 (device blocks only) a router places it by rendezvous: on b, cold.
  for (int seed : {90005, 90006}) REQUIRE(a.post("/v1/completions", body(token_prompt(seed, 20), 2)).status == 200);
  RouterProcess device_only({&a, &b}, {"--host-tier-weight", "0", "--disk-tier-weight", "0", "--shared-tier-weight", "0"});
  REQUIRE(wait_until([&] { return all_exact(device_only, {&a, &b}); }, std::chrono::seconds(20)));
  REQUIRE(caught_up(device_only, a));
  const http::Response cold = device_only.post("/v1/completions", body(prompt));
  REQUIRE_MESSAGE(cold.status == 200, cold.body);
  CHECK(served_by(cold) == b.base_url());
  CHECK(cached_tokens(cold) == 0);
  CHECK(text(cold) == text(first));
}

TEST_CASE("a prefix in a shared tier is routable to every replica that mounts it") {
  TempDir shared;
  const std::vector<std::string> flags{"--num-kv-blocks", "64", "--kv-shared-dir", shared.path().string()};
  auto a = std::make_unique<ReplicaProcess>(flags);
  ReplicaProcess b(flags), c({"--num-kv-blocks", "64"});  // c does not mount it
  RouterProcess router({a.get(), &b, &c}, {"--health-interval-ms", "200"});
  REQUIRE(wait_until([&] { return all_exact(router, {a.get(), &b, &c}); }, std::chrono::seconds(20)));
  const std::string a_url = a->base_url();
  const auto shared_id = router.replica(a_url).at("shared_tier").to_number<std::uint64_t>();
  CHECK(shared_id != 0);
  CHECK(router.replica(b.base_url()).at("shared_tier").to_number<std::uint64_t>() == shared_id);
  CHECK(router.replica(c.base_url()).at("shared_tier").to_number<std::uint64_t>() == 0);
  // Without the shared tier's marks, the router would place it on c once a is gone.
  const std::vector<TokenId> prompt = prompt_placed_on(c.base_url(), {b.base_url(), c.base_url()}, 10);

  const http::Response first = a->post("/v1/completions", body(prompt));  // a computes it and writes it
  REQUIRE_MESSAGE(first.status == 200, first.body);
  REQUIRE_MESSAGE(wait_until([&] { return tier_blocks(router, b, "shared") >= 10; }, std::chrono::seconds(10)),
                  router.get("/admin/replicas").body);
  REQUIRE(caught_up(router, *a));
  CHECK(tier_blocks(router, *a, "shared") >= 10);
  CHECK(tier_blocks(router, c, "shared") == 0);
  const http::Response on_a = router.post("/v1/completions", body(prompt));
  CHECK(served_by(on_a) == a_url);  // on a's device: worth more than b's shared copy

  a.reset();  // a goes away; b reads what a wrote
  REQUIRE(wait_until([&] { return !router.replica(a_url).at("healthy").as_bool(); }, std::chrono::seconds(10)));
  const http::Response on_b = router.post("/v1/completions", body(prompt));
  REQUIRE_MESSAGE(on_b.status == 200, on_b.body);
  CHECK(served_by(on_b) == b.base_url());
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"tier_hit\"") == 1);
  CHECK(cached_tokens(on_b) == 10 * static_cast<std::int64_t>(kBlock));
  CHECK(text(on_b) == text(first));
}

}  // namespace kvfleet::test
