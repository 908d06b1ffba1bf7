#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "router/prefix_tree.h"

using namespace kvfleet;
using namespace kvfleet::router;

namespace {

using Chain = std::vector<BlockHash>;

ReplicaMask bit(ReplicaId r) { return ReplicaMask{1} << r; }
void ok(const PrefixTree& t) { REQUIRE_NOTHROW(t.check_integrity()); }

}  // namespace

TEST_CASE("LRU eviction drops leaf marks oldest first, parents once their children are gone") {
  PrefixTree t;
  t.insert(0, Chain{1, 2, 3, 4}, 1);
  t.insert(1, Chain{1, 2, 3, 4}, 2);
  t.insert(0, Chain{10, 11}, 3);
  t.insert(1, Chain{20, 21}, 4);
  t.insert(0, Chain{1, 2, 5, 6}, 5);
  ok(t);
  // Nodes: [1 2]{r0@5, r1@2} -> [3 4]{r0@1, r1@2}, [5 6]{r0@5}; [10 11]{r0@3}; [20 21]{r1@4}.
  // Each evict(bytes() - 1) takes exactly one mark: dropping a mark frees at least its tick.
  const auto evict_one = [&] {
    REQUIRE(t.evict(t.bytes() - 1) == 1);
    ok(t);
  };
  evict_one();  // [3 4] r0@1
  CHECK(t.holders(3) == bit(1));
  evict_one();  // [3 4] r1@2: the node goes; [1 2] becomes a leaf mark of r1
  CHECK(t.holders(3) == 0);
  CHECK(t.holders(1) == (bit(0) | bit(1)));
  evict_one();  // [1 2] r1@2
  CHECK(t.holders(1) == bit(0));
  evict_one();  // [10 11] r0@3
  CHECK(t.holders(10) == 0);
  evict_one();  // [20 21] r1@4
  CHECK(t.holders(20) == 0);
  evict_one();  // tick 5 twice: the deeper (newer) node [5 6] goes before [1 2]
  CHECK(t.holders(5) == 0);
  CHECK(t.holders(1) == bit(0));
  evict_one();
  CHECK(t.stats().nodes == 0);
  CHECK(t.evict(0) == 0);
}

TEST_CASE("the memory bound evicts the least recently used chains on insert") {
  // One 4-block chain held by one replica: one node record, 4 x 18 bytes, one tick.
  const std::size_t chain_bytes = 48 + 4 * 18 + 8;
  PrefixTree t(PrefixTreeConfig{.max_bytes = 2 * chain_bytes, .evict_to = 1.0});
  t.insert(0, Chain{1, 2, 3, 4}, 1);
  t.insert(1, Chain{11, 12, 13, 14}, 2);
  CHECK(t.bytes() == 2 * chain_bytes);
  t.insert(0, Chain{21, 22, 23, 24}, 3);
  ok(t);
  CHECK(t.bytes() == 2 * chain_bytes);
  CHECK(t.holders(1) == 0);
  CHECK(t.holders(11) == bit(1));
  CHECK(t.holders(21) == bit(0));
  t.touch(1, Chain{11, 12, 13, 14}, 10);  // now [21..24] is the oldest
  t.insert(2, Chain{31, 32, 33, 34}, 11);
  ok(t);
  CHECK(t.holders(21) == 0);
  CHECK(t.holders(11) == bit(1));
  CHECK(t.holders(31) == bit(2));
}

// Differential test: random chains sharing prefixes, random removals and clears, compared with a
// plain model (per replica, the set of blocks it holds; a removal takes the block's descendants).
TEST_CASE("random operations match a brute-force model, integrity after each") {
  std::mt19937_64 rng(1234);
  PrefixTree t;
  std::vector<Chain> prompts;
  std::map<BlockHash, BlockHash> parent_of;  // the universe of blocks, 0 = root
  std::vector<std::set<BlockHash>> held(4);
  const auto descendants = [&](BlockHash h) {
    std::set<BlockHash> out{h};
    bool grew = true;
    while (grew) {
      grew = false;
      for (const auto& [child, parent] : parent_of) {
        if (out.count(parent) != 0 && out.insert(child).second) grew = true;
      }
    }
    return out;
  };
  for (int step = 0; step < 600; ++step) {
    const auto r = static_cast<ReplicaId>(rng() % 4);
    const int op = static_cast<int>(rng() % 10);
    if (op < 6 || prompts.empty()) {
      Chain c;
      if (!prompts.empty() && rng() % 3 != 0) {
        const Chain& base = prompts[rng() % prompts.size()];
        c.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(rng() % (base.size() + 1)));
      }
      const std::size_t extra = rng() % 6;
      for (std::size_t k = 0; k < extra; ++k) {
        const BlockHash h = rng() | 1;
        parent_of[h] = c.empty() ? 0 : c.back();
        c.push_back(h);
      }
      t.insert(r, c, static_cast<Tick>(step));
      held[r].insert(c.begin(), c.end());
      prompts.push_back(c);
    } else if (op < 9) {
      const Chain& p = prompts[rng() % prompts.size()];
      if (p.empty()) continue;
      const BlockHash h = p[rng() % p.size()];
      const bool had = held[r].count(h) != 0;
      CHECK(t.remove(r, Chain{h}) == (had ? 1u : 0u));
      if (had) {
        for (const BlockHash d : descendants(h)) held[r].erase(d);
      }
    } else {
      t.clear_replica(r);
      held[r].clear();
    }
    ok(t);
    for (int probe = 0; probe < 4; ++probe) {
      const Chain& p = prompts[rng() % prompts.size()];
      const MatchResult m = t.match(p);
      for (ReplicaId q = 0; q < 4; ++q) {
        std::uint32_t expect = 0;
        while (expect < p.size() && held[q].count(p[expect]) != 0) ++expect;
        REQUIRE(m.of(q) == expect);
      }
    }
  }
  std::size_t entries = 0;
  for (const auto& h : held) entries += h.size();
  CHECK(t.stats().entries == entries);
}

// Everything at once under a tight memory bound: no model, but the invariants must hold after
// every step, the bound must hold after every insert, and insert_after must equal a full insert.
TEST_CASE("random mixed operations under a memory bound keep every invariant") {
  std::mt19937_64 rng(99);
  PrefixTree t(PrefixTreeConfig{.max_bytes = 20000, .evict_to = 0.8});
  std::vector<Chain> prompts;
  Tick now = 0;
  for (int step = 0; step < 1500; ++step) {
    now += 1 + rng() % 3;
    const auto r = static_cast<ReplicaId>(rng() % 6);
    const int op = static_cast<int>(rng() % 12);
    const Chain* p = prompts.empty() ? nullptr : &prompts[rng() % prompts.size()];
    if (op < 5 || p == nullptr) {
      Chain c;
      if (p != nullptr && rng() % 2 == 0) c.assign(p->begin(), p->begin() + static_cast<std::ptrdiff_t>(rng() % (p->size() + 1)));
      for (std::size_t k = 0, n = 1 + rng() % 20; k < n; ++k) c.push_back(rng());
      t.insert(r, c, now);
      CHECK(t.bytes() <= 20000);
      prompts.push_back(std::move(c));
    } else if (op < 7) {
      // A stored event continuing p after block k: r must then hold all of p (if p is still there).
      const std::size_t k = 1 + rng() % p->size();
      const Chain tail(p->begin() + static_cast<std::ptrdiff_t>(k), p->end());
      const bool parent_known = t.holders((*p)[k - 1]) != 0;
      t.insert_after(r, (*p)[k - 1], tail, now);
      CHECK(t.bytes() <= 20000);
      if (parent_known && t.match(*p).longest == p->size()) CHECK(t.match(*p).of(r) == p->size());
    } else if (op < 8) {
      t.touch(r, *p, now);
    } else if (op < 10) {
      t.remove(r, Chain{(*p)[rng() % p->size()]});
    } else if (op < 11) {
      t.expire(ReplicaMask{1} << r | ReplicaMask{1} << ((r + 1) % 6), now > 40 ? now - 40 : 0);
    } else {
      t.clear_replica(r);
    }
    ok(t);
    const MatchResult m = t.match(prompts[rng() % prompts.size()]);  // p may dangle after push_back
    for (ReplicaId q = 0; q < 6; ++q) CHECK(m.of(q) <= m.longest);
  }
  CHECK(t.stats().nodes > 0);
}
