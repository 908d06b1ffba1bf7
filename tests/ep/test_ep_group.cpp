// EpGroup (kvfleet/ep_group.h): N in-process expert-parallel ranks behind one front. Outputs equal one
// engine's, prompts meet the rank that caches their prefix, the merged KV event stream is the union of the
// ranks' caches, and an idle group sleeps.
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <set>
#include <thread>

#include "runtime/engine_harness.h"
#include "ep/ep_test_model.h"
#include "kvfleet/ep_group.h"
#include "kvfleet/make_model.h"
#include "support/temp_dir.h"

using namespace kvfleet;
using test::ep_config;
using test::tiny_moe;
using namespace std::chrono_literals;

namespace {

// Every hash a set of KV events leaves held, applied in order from an empty cache.
std::set<BlockHash> replay(const KvEventRing& ring) {
  std::set<BlockHash> held;
  const KvReplay r = ring.since(0);
  REQUIRE_FALSE(r.fell_behind);
  for (const KvEvent& e : r.events) {
    CHECK(e.dp_rank >= 0);
    for (BlockHash h : e.block_hashes) {
      if (e.type == KvEvent::Type::stored) CHECK(held.insert(h).second);  // stored once: when the first rank stores it
      else if (e.type == KvEvent::Type::removed) CHECK(held.erase(h) == 1);
    }
  }
  return held;
}

std::set<BlockHash> union_of_ranks(EpGroup& g) {
  std::set<BlockHash> all;
  for (int r = 0; r < g.size(); ++r)
    for (const auto& b : g.rank(r).kv_snapshot().blocks) all.insert(b.hash);
  return all;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

TEST_CASE("EpGroup: outputs equal one engine's for ep_size 1, 2, 4 (greedy and seeded, shared prefixes, chunked)") {
  test::TempDir dir;
  const Model model = tiny_moe(dir);
  const auto requests = test::equivalence_requests(300);
  EngineConfig c = ep_config(256);
  c.enable_prefix_caching = false;  // the tokens computed per rank must not depend on which rank cached what
  const auto want = test::run_requests(model, requests, c, false, nullptr);
  for (int ep : {1, 2, 4}) {
    CAPTURE(ep);
    EpGroup group(model, c, ep);
    test::Collector col;
    std::set<int> used;
    for (std::size_t i = 0; i < requests.size(); ++i) used.insert(group.submit(requests[i], col.callback(i)).rank);
    for (int r = 0; r < ep; ++r) group.rank(r).wait_idle();
    const auto got = col.results();
    for (const auto& [i, w] : want) {
      const auto request_id = i;
      CAPTURE(request_id);
      CHECK(got.at(i).tokens == w.tokens);
      CHECK(got.at(i).finals == 1);
    }
    CHECK(static_cast<int>(used.size()) == ep);  // all at once: least loaded spreads them over every rank
    for (int r = 0; r < ep; ++r) CHECK(group.unfinished(r) == 0);
  }
}

TEST_CASE("EpGroup: a prompt goes to the rank that caches (or is computing) its prefix") {
  test::TempDir dir;
  const Model model = tiny_moe(dir);
  EpGroup group(model, ep_config(256), 4);
  std::vector<TokenId> system(64);
  for (std::size_t i = 0; i < system.size(); ++i) system[i] = static_cast<TokenId>((i * 37 + 5) % 300);
  auto with_tail = [&](TokenId t) {
    GenerationRequest r;
    r.prompt = system;
    r.prompt.insert(r.prompt.end(), {t, static_cast<TokenId>(t + 1), static_cast<TokenId>(t + 2)});
    r.max_tokens = 2;
    r.ignore_eos = true;
    return r;
  };
  test::Collector col;
  const int first = group.submit(with_tail(1), col.callback(0)).rank;
  const int during = group.submit(with_tail(10), col.callback(1)).rank;  // before the first one's prefill ended
  CHECK(during == first);
  for (int r = 0; r < 4; ++r) group.rank(r).wait_idle();
  const int after = group.submit(with_tail(20), col.callback(2)).rank;
  CHECK(after == first);
  group.rank(after).wait_idle();
  CHECK(col.results().at(2).cached_tokens == 64);  // 4 full blocks of the shared prefix, from that rank's cache
  // Other prefixes spread by load and their own hash, deterministically.
  GenerationRequest other;
  other.prompt = {7, 8, 9, 10, 11};
  other.max_tokens = 1;
  CHECK(group.pick(other.prompt, "") == group.pick(other.prompt, ""));
  // A tenant's salt is its own namespace: the shared prefix does not match there.
  CHECK(group.pick(with_tail(30).prompt, "tenant-b") == group.pick(with_tail(30).prompt, "tenant-b"));
}

TEST_CASE("EpGroup: the merged KV events are the union of the ranks' caches, with dp_rank; the snapshot agrees") {
  test::TempDir dir;
  const Model model = tiny_moe(dir);
  EpGroup group(model, ep_config(12), 2);  // 12 blocks of 16 tokens per rank: the workload evicts
  test::Collector col;
  std::vector<TokenId> shared(48);
  for (std::size_t i = 0; i < shared.size(); ++i) shared[i] = static_cast<TokenId>((i * 11 + 3) % 300);
  std::size_t n = 0;
  auto run_on = [&](int rank, std::vector<TokenId> prompt) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = 2;
    r.ignore_eos = true;
    group.rank(rank).submit(r, col.callback(n++));  // straight to a rank: both ranks cache the same blocks
    group.rank(rank).wait_idle();
  };
  run_on(0, shared);
  run_on(1, shared);
  const auto after_both = group.kv_events()->since(0);
  std::size_t stored = 0;
  for (const auto& e : after_both.events) {
    CHECK(e.type == KvEvent::Type::stored);
    CHECK(e.dp_rank == 0);  // rank 1 stored nothing the group did not hold
    stored += e.block_hashes.size();
  }
  CHECK(stored == 3);
  CHECK(replay(*group.kv_events()) == union_of_ranks(group));
  // Rank 0 evicts the shared blocks: the group still holds them on rank 1, so nothing is removed.
  for (int k = 0; k < 3; ++k) {
    std::vector<TokenId> p(64);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<TokenId>((i * 7 + 100 * k + 1) % 300);
    run_on(0, p);
  }
  const auto held = replay(*group.kv_events());
  CHECK(held == union_of_ranks(group));
  for (std::size_t b = 0; b < 3; ++b) {
    const auto chain = block_hashes(block_hash_root(model.name()), shared, 16);
    CHECK(held.count(chain[b]) == 1);
  }
  // Now rank 1 evicts them too: the last holder drops them, and the group says removed (by dp_rank 1).
  for (int k = 0; k < 3; ++k) {
    std::vector<TokenId> p(64);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<TokenId>((i * 13 + 50 * k + 2) % 300);
    run_on(1, p);
  }
  CHECK(replay(*group.kv_events()) == union_of_ranks(group));
  bool removed_by_1 = false;
  for (const auto& e : group.kv_events()->since(0).events) removed_by_1 |= e.type == KvEvent::Type::removed && e.dp_rank == 1;
  CHECK(removed_by_1);
  // The snapshot: the same set, parents before children.
  const KvSnapshot snap = group.kv_snapshot();
  std::set<BlockHash> seen, from_snapshot;
  for (const auto& b : snap.blocks) {
    from_snapshot.insert(b.hash);
    if (from_snapshot.size() > 1 && union_of_ranks(group).count(b.parent)) CHECK(seen.count(b.parent) == 1);
    seen.insert(b.hash);
  }
  CHECK(from_snapshot == union_of_ranks(group));
  CHECK(snap.seq == group.kv_events()->last_seq());
}

TEST_CASE("EpGroup: an idle group sleeps instead of voting every millisecond, and wakes for a request") {
  test::TempDir dir;
  const Model model = tiny_moe(dir);
  EpGroup group(model, ep_config(64), 4);
  GenerationRequest r;
  r.prompt = {1, 2, 3, 4, 5};
  r.max_tokens = 2;
  r.ignore_eos = true;
  test::Collector col;
  group.submit(r, col.callback(0));
  for (int k = 0; k < 4; ++k) group.rank(k).wait_idle();
  std::this_thread::sleep_for(50ms);  // the vote after the last step finds the group idle
  const double before = cpu_seconds();
  std::this_thread::sleep_for(500ms);
  const double idle_cpu = cpu_seconds() - before;
  MESSAGE("CPU used by an idle 4-rank group in 500 ms: " << idle_cpu * 1000 << " ms");
  CHECK(idle_cpu < 0.02);
  // Wakes: a request to any rank runs (every rank must join the vote for it).
  for (int k = 0; k < 3; ++k) {
    r.prompt = {static_cast<TokenId>(10 + k), 2, 3};
    const auto s = group.rank(k + 1).submit(r, col.callback(static_cast<std::size_t>(1 + k)));
    (void)s;
    group.rank(k + 1).wait_idle();
    CHECK(col.results().at(static_cast<std::size_t>(1 + k)).finals == 1);
  }
}
