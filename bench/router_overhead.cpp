// Routing overhead per request in kvfleet-router: JSON parse, chat template, tokenize + block hashes
// (Gateway::plan, the real code) and match + choose (ReplicaCacheIndex over a populated tree, the
// cache_aware policy), for ~1k-token prompts that share a system prompt and differ in the rest
// (bench/chat_prompts.h: every request distinct, so only what truly recurs can be cached). Prints
// p50/p99 microseconds of each part and of the sum. With `tiers`, the replicas are in exact mode and each
// cached prompt is also in its replica's host tier and in a shared tier all replicas mount (the tier index
// then walks every prompt past the device prefix: the routing cost of tier-aware cache_aware, reported on its
// own; exact mode also makes on_routed leave pending marks, which the approximate default does not).
//   bench_router_overhead [iterations=2000] [replicas=8] [cached_prompts=20000] [completions|chat] [tiers]
#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "bench/chat_prompts.h"
#include "router/gateway/gateway.h"

using namespace kvfleet;
using namespace kvfleet::router;
using Clock = std::chrono::steady_clock;

namespace {

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void report(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::printf("%-28s p50 %8.1f us   p90 %8.1f us   p99 %8.1f us   max %8.1f us\n", what, v[v.size() / 2],
              v[v.size() * 9 / 10], v[v.size() * 99 / 100], v.back());
}

std::string words(std::minstd_rand& rng, int n) {
  static const char* vocab[] = {"cache", "router", "replica", "block", "prefix", "token", "stream", "policy",
                                "health", "request", "latency", "tree", "hash", "model", "batch", "decode"};
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(vocab[rng() % 16]) + (i % 13 == 12 ? ". " : " ");
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int replicas = argc > 2 ? std::atoi(argv[2]) : 8;
  const int cached = argc > 3 ? std::atoi(argv[3]) : 20000;
  const bool chat = argc > 4 && std::string_view(argv[4]) == "chat";
  const bool tiers = argc > 5 && std::string_view(argv[5]) == "tiers";
  const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
  RouterConfig config;
  config.model = std::string(KVFLEET_BENCH_MODEL_DIR);
  for (int r = 0; r < replicas; ++r) config.replicas.push_back("http://127.0.0.1:" + std::to_string(9000 + r));
  Gateway gateway(config);  // not started: plan() needs no server

  std::minstd_rand rng(7);
  // Distinct requests (never repeated within the run), as the proxy bench sends them.
  std::vector<boost::json::object> bodies;
  for (const std::string& text : bench::chat_bodies(iterations + 64, "m")) {
    boost::json::object body = boost::json::parse(text).as_object();
    if (!chat) {  // the same text as one completion prompt
      const auto& m = body.at("messages").as_array();
      std::string prompt = std::string(m[0].at("content").as_string()) + "\n" + std::string(m[1].at("content").as_string());
      body = boost::json::object{{"prompt", prompt}, {"max_tokens", 64}};
    }
    bodies.push_back(std::move(body));
  }
  http::Request request;

  ReplicaCacheConfig cc;
  cc.root = block_hash_root(gateway.model_name());
  ReplicaCacheIndex index(cc);
  std::vector<std::uint64_t> seq(static_cast<std::size_t>(replicas), 0);
  for (int r = 0; r < replicas; ++r) {
    index.add_replica(static_cast<ReplicaId>(r));
    if (!tiers) continue;
    index.begin_stream(static_cast<ReplicaId>(r));
    KvEventMessage config;
    config.type = KvEventMessage::Type::config;
    config.block_size = cc.block_size;
    config.root = cc.root;
    config.shared_tier = 0x5EED;
    index.apply_event(static_cast<ReplicaId>(r), config, 1);
  }
  // A prompt in r's host tier and in the shared tier (exact mode: as the replica's events say).
  const auto in_tiers = [&](ReplicaId r, const std::vector<BlockHash>& hashes) {
    for (const Medium m : {Medium::host, Medium::shared}) {
      KvEventMessage e;
      e.seq = ++seq[r];
      e.block_hashes = hashes;
      e.medium = m;
      index.apply_event(r, e, 1);
    }
  };
  std::unique_ptr<Policy> policy = make_policy("cache_aware");
  // A busy tree: many cached prompts spread over the replicas, plus our bodies' prefixes.
  for (int i = 0; i < cached; ++i) {
    const RoutePlan p = gateway.plan("/v1/completions", boost::json::object{{"prompt", words(rng, 40)}}, request);
    index.on_routed(static_cast<ReplicaId>(i % replicas), p.hashes, 1);
    if (tiers) in_tiers(static_cast<ReplicaId>(i % replicas), p.hashes);
  }
  for (std::size_t i = 0; i < 64; ++i)  // warm-up, and the shared prefix into the tree
    index.on_routed(static_cast<ReplicaId>(i % replicas), gateway.plan(path, bodies[iterations + i], request).hashes, 1);

  std::vector<double> plan_us, choose_us, total_us, tier_us;
  std::uint64_t tokens = 0;
  std::vector<ReplicaState> states(static_cast<std::size_t>(replicas));
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    const RoutePlan plan = gateway.plan(path, bodies[static_cast<std::size_t>(i)], request);
    const auto t1 = Clock::now();
    const MatchResult match = index.match(plan.hashes);
    const auto tw = Clock::now();
    const TierMatch by_tier = index.match_tiers(plan.hashes, match);
    tier_us.push_back(micros(Clock::now() - tw));
    for (int r = 0; r < replicas; ++r) {
      const auto slot = static_cast<ReplicaId>(r);
      states[r].id = config.replicas[r];
      states[r].in_flight_requests = static_cast<std::uint32_t>(rng() % 4);
      states[r].matched_blocks = by_tier.of(slot, Medium::device);
      states[r].host_blocks = by_tier.of(slot, Medium::host);
      states[r].disk_blocks = by_tier.of(slot, Medium::disk);
      states[r].shared_blocks = by_tier.of(slot, Medium::shared);
    }
    RoutingRequest rr;
    rr.prompt_blocks = static_cast<std::uint32_t>(plan.hashes.size());
    rr.prompt_tokens = plan.prompt_tokens;
    const Decision d = policy->choose(rr, states);
    index.on_routed(static_cast<ReplicaId>(d.replica), plan.hashes, 2 + i);
    const auto t2 = Clock::now();
    tokens += plan.prompt_tokens;
    plan_us.push_back(micros(t1 - t0));
    if (std::getenv("KVFLEET_BENCH_SLOW") && micros(t1 - t0) > 1000)
      std::printf("slow plan: body %d, %.0f us\n", i, micros(t1 - t0));
    choose_us.push_back(micros(t2 - t1));
    total_us.push_back(micros(t2 - t0));
  }
  const TreeStats s = index.tree().stats();
  std::printf("%s: prompt %.0f tokens avg, %d replicas, tree %zu nodes / %zu blocks / %zu bytes, tier index %zu blocks, "
              "%d iterations\n",
              path.c_str(), double(tokens) / iterations, replicas, s.nodes, s.blocks, s.bytes, index.tiers().size(),
              iterations);
  report("tokenize + hash (plan)", plan_us);
  report("match + choose + on_routed", choose_us);
  report("  of which the tier walk", tier_us);
  report("total routing overhead", total_us);
  return 0;
}
