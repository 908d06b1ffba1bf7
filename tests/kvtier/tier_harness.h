// The tier tests' scenario: a conversation, two long unrelated prompts that push it out of a small device
// pool, and the conversation's return; run on fresh engines so that every way its prefix can come back
// (recompute, device hit, host, disk, shared) is compared token for token.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model.h"
#include "runtime/engine_harness.h"
#include "support/temp_dir.h"

namespace kvfleet::test {

inline constexpr std::int32_t kTierVocab = 300;

inline Model tier_model(const std::filesystem::path& dir) {
  MakeModelOptions o;
  o.dtype = DType::bf16;
  o.vocab = kTierVocab;
  o.layers = 2;
  make_model(o, dir);
  return Model::load(dir);
}

inline std::vector<TokenId> tier_tokens(std::size_t n, std::uint32_t seed) {
  std::vector<TokenId> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<TokenId>((i * 7 + seed * 31 + (i * i) % 13) % kTierVocab);
  return out;
}

// 24 blocks of 16: the conversation (10 blocks + outputs) is evicted by the two 300-token prompts.
inline EngineConfig tier_config(std::int32_t num_blocks = 24) {
  EngineConfig c = engine_config(num_blocks, 512, true);
  return c;
}

struct TierRun {
  Collected first, back;
  EngineStats stats;
};

// The conversation (160 tokens), two 300-token prompts, then the conversation again with `sampling`.
// `evict`: run the two long prompts in between.
inline TierRun run_tier_scenario(Engine& engine, const SamplingParams& sampling, bool evict = true) {
  Collector col;
  GenerationRequest convo;
  convo.prompt = tier_tokens(160, 1);
  convo.max_tokens = 8;
  convo.ignore_eos = true;
  convo.sampling = sampling;
  engine.submit(convo, col.callback(0));
  engine.wait_idle();
  if (evict) {
    for (std::uint32_t s = 2; s <= 3; ++s) {
      GenerationRequest other;
      other.prompt = tier_tokens(300, s);
      other.max_tokens = 4;
      other.ignore_eos = true;
      engine.submit(other, col.callback(s));
      engine.wait_idle();
    }
  }
  engine.submit(convo, col.callback(1));
  engine.wait_idle();
  TierRun run;
  run.first = col.results().at(0);
  run.back = col.results().at(1);
  run.stats = engine.stats();
  const auto kv = run.stats.scheduler.kv;
  CHECK_MESSAGE(kv.num_free_blocks == kv.num_blocks, "blocks leaked");
  return run;
}

inline SamplingParams greedy() {
  SamplingParams s;
  s.temperature = 0.0f;
  return s;
}

inline SamplingParams seeded() {
  SamplingParams s;
  s.temperature = 0.8f;
  s.top_k = 50;
  s.seed = 7;
  return s;
}

inline const KvTierMediumStats& medium(const EngineStats& s, KvMedium m) {
  return s.kv_tiers.media[static_cast<std::size_t>(m)];
}

}  // namespace kvfleet::test
