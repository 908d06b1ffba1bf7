// PrefixTree: memory per (block, replica) entry and match time.
//
// BM_Memory: 4 replicas x 10k prompts each of 1k-8k tokens (64-512 blocks of 16 tokens). Half of
// the prompts continue an earlier prompt (a multi-turn chat: the whole earlier prompt plus new
// blocks), routed to the earlier prompt's replica 3 times out of 4; the rest start from one of 64
// shared system prompts (16-128 blocks) and go to any replica. Counters: nodes, blocks, entries,
// bytes (the tree's live estimate), bytes per entry from its accounting (allocated_bytes) and from
// the heap itself (glibc mallinfo2 before/after, so allocator headers count too).
//
// BM_Match: match() on a 128k-token prompt (8192 blocks) that one replica holds in full, over a
// path of 64 nodes (a branch of another replica every 128 blocks: a long chat) and, as a worst
// case, of 8192 nodes (a branch at every block). Goal: under 1 ms.
//
// BM_Fleet/R: the router at fleet scale: 100k cached prefixes over R replicas (4 or 64).
// 1,000 system prompts of 8-32 blocks, each prefix a system prompt plus 4-32 blocks of its own, held by
// one replica (a quarter of them by a second one too). Counters: bytes per (block, replica) entry, and the
// time of one routing decision's tree work: match() of a cached prefix plus the choice over all R replicas
// (most matched blocks, ties to the lower load), as the cache_aware policy does per request.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <random>
#include <vector>

#include "router/prefix_tree.h"

using namespace kvfleet;
using namespace kvfleet::router;

namespace {

using Chain = std::vector<BlockHash>;

// Small blocks come from the arena (uordblks), big arrays are mmapped (hblkhd): count both.
std::size_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

void BM_Memory(benchmark::State& state) {
  for (auto _ : state) {
    std::mt19937_64 rng(7);
    const auto fresh = [&](Chain& c, std::size_t n) {
      for (std::size_t k = 0; k < n; ++k) c.push_back(rng());
    };
    std::vector<Chain> systems(64);
    for (Chain& s : systems) fresh(s, 16 + rng() % 113);
    std::vector<Chain> prompts;
    std::vector<ReplicaId> owner;
    constexpr int kPrompts = 40000;
    prompts.reserve(kPrompts);
    for (int i = 0; i < kPrompts; ++i) {
      const std::size_t target = 64 + rng() % 449;
      Chain c;
      ReplicaId r = static_cast<ReplicaId>(rng() % 4);
      if (!prompts.empty() && rng() % 2 == 0) {
        const std::size_t parent = rng() % prompts.size();
        c = prompts[parent];
        if (rng() % 4 != 0) r = owner[parent];
      } else {
        c = systems[rng() % systems.size()];
      }
      fresh(c, target > c.size() ? target - c.size() : 16);
      prompts.push_back(std::move(c));
      owner.push_back(r);
    }
    const std::size_t heap_before = heap_in_use();
    {
      PrefixTree tree;
      for (std::size_t i = 0; i < prompts.size(); ++i) tree.insert(owner[i], prompts[i], i);
      const std::size_t heap_after = heap_in_use();
      const TreeStats s = tree.stats();
      const auto entries = static_cast<double>(s.entries);
      state.counters["nodes"] = static_cast<double>(s.nodes);
      state.counters["blocks"] = static_cast<double>(s.blocks);
      state.counters["entries"] = entries;
      state.counters["MiB_heap"] = static_cast<double>(heap_after - heap_before) / (1 << 20);
      state.counters["B_per_entry_live"] = static_cast<double>(s.bytes) / entries;
      state.counters["B_per_entry_alloc"] = static_cast<double>(s.allocated_bytes) / entries;
      state.counters["B_per_entry_heap"] = static_cast<double>(heap_after - heap_before) / entries;
    }
  }
}
BENCHMARK(BM_Memory)->Iterations(1)->Unit(benchmark::kMillisecond);

// A tree where replica 0 holds the 8192-block prompt and replica 1 branches off every `stride`
// blocks; `noise` other prompts of replicas 2 and 3 fill the index so lookups miss the cache.
struct MatchSetup {
  PrefixTree tree;
  Chain prompt;
  MatchSetup(std::size_t stride, int noise) {
    std::mt19937_64 rng(11);
    for (int k = 0; k < 8192; ++k) prompt.push_back(rng());
    tree.insert(0, prompt, 1);
    for (std::size_t cut = stride; cut < prompt.size(); cut += stride) {
      Chain branch(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(cut));
      branch.push_back(rng());
      tree.insert(1, branch, 2);
    }
    for (int i = 0; i < noise; ++i) {
      Chain c;
      for (int k = 0; k < 256; ++k) c.push_back(rng());
      tree.insert(2 + static_cast<ReplicaId>(i % 2), c, 3);
    }
  }
};

void BM_Match(benchmark::State& state) {
  static MatchSetup long_chat(128, 4000), every_block(1, 4000);
  MatchSetup& setup = state.range(0) == 128 ? long_chat : every_block;
  std::uint32_t matched = 0;
  for (auto _ : state) {
    const MatchResult m = setup.tree.match(setup.prompt);
    matched = m.of(0);
    benchmark::DoNotOptimize(m);
  }
  if (matched != 8192) state.SkipWithError("replica 0 should match all 8192 blocks");
  state.counters["nodes_on_path"] = static_cast<double>(8192 / state.range(0));
  state.counters["tree_nodes"] = static_cast<double>(setup.tree.stats().nodes);
}
BENCHMARK(BM_Match)->Arg(128)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_Fleet(benchmark::State& state) {
  const auto replicas = static_cast<ReplicaId>(state.range(0));
  std::mt19937_64 rng(13);
  std::vector<Chain> systems(1000);
  for (Chain& c : systems)
    for (std::size_t k = 0, n = 8 + rng() % 25; k < n; ++k) c.push_back(rng());
  std::vector<Chain> prompts(100000);
  std::vector<ReplicaId> owner(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Chain& c = prompts[i];
    c = systems[rng() % systems.size()];
    for (std::size_t k = 0, n = 4 + rng() % 29; k < n; ++k) c.push_back(rng());
    owner[i] = static_cast<ReplicaId>(rng() % replicas);
  }
  const std::size_t heap_before = heap_in_use();  // the tree's own memory only, not the prompts'
  PrefixTree tree;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    tree.insert(owner[i], prompts[i], i);
    if (i % 4 == 0) tree.insert(static_cast<ReplicaId>((owner[i] + 1) % replicas), prompts[i], i);
  }
  const std::size_t heap_after = heap_in_use();
  const TreeStats s = tree.stats();
  std::vector<std::uint32_t> load(replicas);
  for (auto& l : load) l = static_cast<std::uint32_t>(rng() % 8);
  std::size_t next = 0;
  ReplicaId chosen = 0;
  for (auto _ : state) {
    const Chain& prompt = prompts[(next++ * 7919) % prompts.size()];
    const MatchResult m = tree.match(prompt);
    ReplicaId best = 0;
    for (ReplicaId r = 1; r < replicas; ++r)
      if (m.of(r) > m.of(best) || (m.of(r) == m.of(best) && load[r] < load[best])) best = r;
    chosen = best;
    benchmark::DoNotOptimize(chosen);
  }
  state.counters["prefixes"] = static_cast<double>(prompts.size());
  state.counters["entries"] = static_cast<double>(s.entries);
  state.counters["B_per_entry_live"] = static_cast<double>(s.bytes) / static_cast<double>(s.entries);
  state.counters["B_per_entry_heap"] =
      static_cast<double>(heap_after - heap_before) / static_cast<double>(s.entries);
}
BENCHMARK(BM_Fleet)->Arg(4)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
