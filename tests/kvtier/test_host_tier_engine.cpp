// The host tier in a running engine: a conversation evicted from a small device pool comes back from host
// memory, with the same tokens as when it is recomputed or found in the device pool.
#include <doctest/doctest.h>

#include "kvtier/tier_harness.h"

using namespace kvfleet;
using namespace kvfleet::test;

TEST_CASE("a prefix back from the host tier gives the tokens of a recompute and of a device hit") {
  TempDir dir;
  const Model model = tier_model(dir.path());
  for (const SamplingParams& sampling : {greedy(), seeded()}) {
    CAPTURE(sampling.temperature);
    Engine plain(model, tier_config());
    const TierRun recompute = run_tier_scenario(plain, sampling);
    CHECK(recompute.back.cached_tokens == 0);  // the long prompts did evict the conversation
    CHECK(medium(recompute.stats, KvMedium::host).hit_tokens == 0);

    Engine big(model, tier_config(512));
    const TierRun device = run_tier_scenario(big, sampling);
    CHECK(device.back.cached_tokens == 144);  // 9 full blocks: the last prompt token is always computed

    EngineConfig c = tier_config();
    c.kv_tiers.host_bytes = 64 << 20;
    Engine tiered(model, c);
    const TierRun host = run_tier_scenario(tiered, sampling);
    CHECK(host.back.cached_tokens == 144);
    const auto& h = medium(host.stats, KvMedium::host);
    CHECK(h.hit_tokens == 144);
    CHECK(h.onload_bytes > 0);
    CHECK(h.offload_bytes >= h.onload_bytes);
    CHECK(h.blocks > 0);

    CHECK(recompute.first.tokens.size() == 8);
    CHECK(recompute.back.tokens == recompute.first.tokens);
    CHECK(device.back.tokens == recompute.back.tokens);
    CHECK(host.back.tokens == recompute.back.tokens);
    CHECK(host.first.tokens == recompute.first.tokens);
  }
}

TEST_CASE("a host tier too small for a block keeps nothing and changes nothing") {
  TempDir dir;
  const Model model = tier_model(dir.path());
  EngineConfig c = tier_config();
  c.kv_tiers.host_bytes = 1;
  Engine engine(model, c);
  const TierRun run = run_tier_scenario(engine, greedy());
  CHECK(run.back.cached_tokens == 0);
  CHECK(medium(run.stats, KvMedium::host).blocks == 0);
  CHECK(run.back.tokens == run.first.tokens);
}

TEST_CASE("tiers need prefix caching") {
  TempDir dir;
  const Model model = tier_model(dir.path());
  EngineConfig c = tier_config();
  c.enable_prefix_caching = false;
  c.kv_tiers.host_bytes = 1 << 20;
  CHECK_THROWS_WITH_AS(Engine(model, c), "KV cache tiers need prefix caching", std::invalid_argument);
}

TEST_CASE("a KV snapshot lists the prefix cache, then the host tier's blocks with their medium and parent") {
  TempDir dir;
  const Model model = tier_model(dir.path());
  EngineConfig c = tier_config();
  c.kv_tiers.host_bytes = 64 << 20;
  Engine engine(model, c);
  run_tier_scenario(engine, greedy());
  const KvSnapshot snap = engine.kv_snapshot();
  std::size_t device = 0, host = 0;
  bool device_first = true;
  for (const KvSnapshot::Entry& e : snap.blocks) {
    if (e.medium == KvMedium::device) {
      device_first = device_first && host == 0;
      ++device;
    } else {
      CHECK(e.medium == KvMedium::host);
      CHECK(e.parent != 0);
      ++host;
    }
  }
  CHECK(device_first);
  CHECK(device == static_cast<std::size_t>(engine.stats().scheduler.kv.num_cached_blocks));
  CHECK(host == medium(engine.stats(), KvMedium::host).blocks);
  CHECK(host > 0);
}
