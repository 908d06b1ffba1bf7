// EpGroup's per-rank KV event ring and the rank hint (routing to (replica, rank)): each rank's
// own events with its dp_rank replay to exactly that rank's cache, through eviction on one rank and then
// the other; the per-rank snapshot agrees; submit() with a dp_rank runs there.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <stdexcept>

#include "runtime/engine_harness.h"
#include "ep/ep_test_model.h"
#include "kvfleet/ep_group.h"
#include "kvfleet/make_model.h"
#include "support/temp_dir.h"

using namespace kvfleet;
using test::ep_config;
using test::tiny_moe;

namespace {

// Per rank, the hashes the per-rank events leave held, applied in order from empty caches.
std::map<int, std::set<BlockHash>> replay_per_rank(const KvEventRing& ring) {
  std::map<int, std::set<BlockHash>> held;
  const KvReplay r = ring.since(0);
  REQUIRE_FALSE(r.fell_behind);
  for (const KvEvent& e : r.events) {
    REQUIRE(e.dp_rank >= 0);
    CHECK(e.type != KvEvent::Type::cleared);  // a rank's cleared goes out as a removed of what it held
    for (BlockHash h : e.block_hashes) {
      if (e.type == KvEvent::Type::stored) held[e.dp_rank].insert(h);
      else CHECK(held[e.dp_rank].erase(h) == 1);
    }
  }
  return held;
}

std::set<BlockHash> cache_of(EpGroup& g, int r) {
  std::set<BlockHash> all;
  for (const auto& b : g.rank(r).kv_snapshot().blocks) all.insert(b.hash);
  return all;
}

std::vector<TokenId> prompt_of(std::size_t len, std::size_t mul, std::size_t add) {
  std::vector<TokenId> p(len);
  for (std::size_t i = 0; i < len; ++i) p[i] = static_cast<TokenId>((i * mul + add) % 300);
  return p;
}

}  // namespace

TEST_CASE("EpGroup: the per-rank KV events replay to each rank's own cache; the per-rank snapshot agrees") {
  test::TempDir dir;
  const Model model = tiny_moe(dir);
  EpGroup group(model, ep_config(12), 2);  // 12 blocks of 16 tokens per rank: the workload evicts
  test::Collector col;
  std::size_t n = 0;
  auto run_on = [&](int rank, std::vector<TokenId> prompt) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = 2;
    r.ignore_eos = true;
    const auto s = group.submit(r, col.callback(n++), rank);  // the hint: this rank, whatever pick() says
    CHECK(s.rank == rank);
    group.rank(rank).wait_idle();
  };
  const std::vector<TokenId> shared = prompt_of(48, 11, 3);
  run_on(0, shared);
  run_on(1, shared);  // the union stream says nothing here (rank 0 held it first); the per-rank one does
  auto held = replay_per_rank(*group.kv_events_per_rank());
  CHECK(held[0] == cache_of(group, 0));
  CHECK(held[1] == cache_of(group, 1));
  CHECK(held[1].size() == 3);
  for (int k = 0; k < 3; ++k) run_on(0, prompt_of(64, 7, 100 * k + 1));  // rank 0 evicts
  for (int k = 0; k < 3; ++k) run_on(1, prompt_of(64, 13, 50 * k + 2));  // then rank 1
  held = replay_per_rank(*group.kv_events_per_rank());
  CHECK(held[0] == cache_of(group, 0));
  CHECK(held[1] == cache_of(group, 1));
  const EpGroup::RankedSnapshot snap = group.kv_snapshot_per_rank();
  CHECK(snap.seq == group.kv_events_per_rank()->last_seq());
  std::map<int, std::set<BlockHash>> from_snapshot;
  for (const auto& b : snap.blocks) {
    auto& seen = from_snapshot[b.dp_rank];
    if (held[b.dp_rank].count(b.parent)) CHECK(seen.count(b.parent) == 1);  // parents first, within the rank
    seen.insert(b.hash);
  }
  CHECK(from_snapshot[0] == held[0]);
  CHECK(from_snapshot[1] == held[1]);
  GenerationRequest r;
  r.prompt = shared;
  r.max_tokens = 1;
  CHECK_THROWS_AS(group.submit(r, col.callback(n++), 2), std::out_of_range);
  CHECK(group.unfinished(0) == 0);  // a refused hint takes no load
}
