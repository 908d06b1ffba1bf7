#include <doctest/doctest.h>

#include <vector>

#include "router/prefix_tree.h"

using namespace kvfleet;
using namespace kvfleet::router;

namespace {

using Chain = std::vector<BlockHash>;

ReplicaMask bit(ReplicaId r) { return ReplicaMask{1} << r; }

// The tree must be whole after every operation; REQUIRE_NOTHROW names the broken invariant.
void ok(const PrefixTree& t) { REQUIRE_NOTHROW(t.check_integrity()); }

}  // namespace

TEST_CASE("chains that share a prefix split an edge; match counts per replica") {
  PrefixTree t;
  t.insert(0, Chain{1, 2, 3, 4, 5}, 1);
  ok(t);
  CHECK(t.stats().nodes == 1);
  t.insert(1, Chain{1, 2, 3, 9, 10}, 2);
  ok(t);
  const TreeStats s = t.stats();
  CHECK(s.nodes == 3);  // [1 2 3] -> {[4 5], [9 10]}
  CHECK(s.blocks == 7);
  CHECK(s.entries == 10);
  CHECK(s.bytes == 3 * 48 + 7 * 18 + 4 * 8);  // node records, hash + index, one tick per holder

  MatchResult m = t.match(Chain{1, 2, 3, 4, 5, 6});
  CHECK(m.of(0) == 5);
  CHECK(m.of(1) == 3);
  CHECK(m.of(2) == 0);
  CHECK(m.longest == 5);
  m = t.match(Chain{1, 2, 3, 9});
  CHECK(m.of(0) == 3);
  CHECK(m.of(1) == 4);
  CHECK(m.longest == 4);
  m = t.match(Chain{1, 2, 7});
  CHECK(m.of(0) == 2);
  CHECK(m.of(1) == 2);
  // A chain must start at the root: block 2 is the second block of a stored chain, not a first.
  CHECK(t.match(Chain{2, 3}).longest == 0);
  CHECK(t.match(Chain{}).longest == 0);
}

TEST_CASE("a chain that ends inside an edge splits it only for a new holder") {
  PrefixTree t;
  t.insert(0, Chain{1, 2, 3, 4, 5, 6}, 1);
  t.insert(0, Chain{1, 2}, 2);  // r0 already holds the whole edge: no split
  ok(t);
  CHECK(t.stats().nodes == 1);
  t.insert(1, Chain{1, 2, 3}, 3);
  ok(t);
  CHECK(t.stats().nodes == 2);
  CHECK(t.stats().entries == 9);
  const MatchResult m = t.match(Chain{1, 2, 3, 4, 5, 6});
  CHECK(m.of(0) == 6);
  CHECK(m.of(1) == 3);
  CHECK(t.holders(3) == (bit(0) | bit(1)));
  CHECK(t.holders(4) == bit(0));
}

TEST_CASE("insert_after places a stored event's chain under its parent block") {
  PrefixTree t;
  t.insert(0, Chain{1, 2, 3}, 1);
  t.insert_after(1, 2, Chain{7, 8}, 2);  // r1 then holds 1 2 7 8
  ok(t);
  MatchResult m = t.match(Chain{1, 2, 7, 8});
  CHECK(m.of(0) == 2);
  CHECK(m.of(1) == 4);
  m = t.match(Chain{1, 2, 3});
  CHECK(m.of(0) == 3);
  CHECK(m.of(1) == 2);
  // The parent is the last block of an edge: the chain goes below it without a split.
  t.insert_after(2, 8, Chain{9}, 3);
  ok(t);
  CHECK(t.match(Chain{1, 2, 7, 8, 9}).of(2) == 5);
  // An unknown parent (a block the tree evicted, or never had) drops the chain.
  CHECK_FALSE(t.insert_after(3, 999, Chain{50, 51}, 4));
  ok(t);
  CHECK(t.match(Chain{50, 51}).longest == 0);
  // An empty chain still marks the path to the parent.
  t.insert_after(4, 1, Chain{}, 5);
  ok(t);
  CHECK(t.match(Chain{1, 2, 3}).of(4) == 1);
}

TEST_CASE("a chain whose parent is unknown leaves no orphan: the later full insert of it is whole") {
  PrefixTree t;
  CHECK_FALSE(t.insert_after(0, 40, Chain{41, 42}, 1));  // parent 40 not in the tree
  ok(t);
  CHECK(t.stats().nodes == 0);
  t.insert(1, Chain{40, 41, 42, 43}, 2);
  ok(t);
  CHECK(t.match(Chain{40, 41, 42, 43}).of(1) == 4);  // an orphan [41 42] at the root would stop it at 1
  CHECK(t.insert_after(0, 41, Chain{42, 44}, 3));
  CHECK(t.match(Chain{40, 41, 42, 44}).of(0) == 4);
}

TEST_CASE("removing one block drops that replica's mark on it and on its descendants") {
  PrefixTree t;
  t.insert(0, Chain{1, 2, 3, 4, 5, 6}, 1);
  t.insert(1, Chain{1, 2, 3, 4, 5, 6}, 2);
  t.insert(1, Chain{1, 2, 3, 4, 7, 8}, 3);
  ok(t);
  CHECK(t.remove(1, Chain{3}) == 1);  // mid-edge: the edge splits before block 3
  ok(t);
  MatchResult m = t.match(Chain{1, 2, 3, 4, 5, 6});
  CHECK(m.of(0) == 6);
  CHECK(m.of(1) == 2);
  m = t.match(Chain{1, 2, 3, 4, 7, 8});
  CHECK(m.of(0) == 4);
  CHECK(m.of(1) == 2);
  CHECK(m.longest == 4);      // 7 8 went with r1: nobody else held them
  CHECK(t.holders(7) == 0);
  CHECK(t.stats().blocks == 6);
  CHECK(t.stats().entries == 8);
  // Events for blocks r1 no longer holds are no-ops, whether the block exists or not.
  CHECK(t.remove(1, Chain{5, 8, 12345}) == 0);
  ok(t);
  CHECK(t.remove(0, Chain{1}) == 1);
  ok(t);
  CHECK(t.stats().blocks == 2);
  CHECK(t.match(Chain{1, 2, 3}).of(1) == 2);
  CHECK(t.match(Chain{1, 2, 3}).of(0) == 0);
}

TEST_CASE("clear_replica and remove_replica drop every mark of one replica") {
  PrefixTree t;
  t.insert(0, Chain{1, 2, 3}, 1);
  t.insert(1, Chain{1, 2, 4}, 2);
  t.insert(0, Chain{10, 11}, 3);
  t.clear_replica(0);
  ok(t);
  TreeStats s = t.stats();
  CHECK(s.nodes == 2);  // [1 2] -> [4], both r1's; the split is not merged back
  CHECK(s.blocks == 3);
  CHECK(s.entries == 3);
  CHECK(t.match(Chain{1, 2, 4}).of(1) == 3);
  CHECK(t.match(Chain{1, 2, 3}).of(0) == 0);
  t.remove_replica(1);
  ok(t);
  s = t.stats();
  CHECK(s.nodes == 0);
  CHECK(s.blocks == 0);
  CHECK(s.bytes == 0);
}

TEST_CASE("ticks: insert sets the path, touch refreshes what the replica holds, match is read-only") {
  PrefixTree t;
  t.insert(0, Chain{1, 2, 3}, 10);
  t.insert(0, Chain{1, 2, 4}, 20);
  CHECK(t.last_used(0, 1) == 20);
  CHECK(t.last_used(0, 3) == 10);
  CHECK(t.last_used(0, 4) == 20);
  (void)t.match(Chain{1, 2, 3});
  CHECK(t.last_used(0, 3) == 10);
  t.touch(0, Chain{1, 2, 3, 99}, 30);
  CHECK(t.last_used(0, 3) == 30);
  CHECK(t.last_used(0, 4) == 20);
  t.touch(1, Chain{1, 2, 3}, 40);  // r1 holds nothing: no effect
  CHECK(t.last_used(1, 1) == 0);
  CHECK(t.last_used(0, 1) == 30);
  t.insert(0, Chain{1, 2}, 5);  // an older time never moves a tick back
  CHECK(t.last_used(0, 1) == 30);
  ok(t);
}

TEST_CASE("TTL: expire drops the marks last used before the cutoff, for the chosen replicas only") {
  PrefixTree t;
  t.insert(0, Chain{1, 2, 3}, 10);
  t.insert(0, Chain{1, 2, 4}, 20);
  t.insert(1, Chain{1, 2, 3}, 5);
  CHECK(t.expire(bit(0), 15) == 1);  // [3] for r0
  ok(t);
  CHECK(t.match(Chain{1, 2, 3}).of(0) == 2);
  CHECK(t.match(Chain{1, 2, 4}).of(0) == 3);
  CHECK(t.match(Chain{1, 2, 3}).of(1) == 3);  // r1 is not swept (e.g. exact mode)
  CHECK(t.expire(bit(0) | bit(1), 21) == 4);  // r0: [1 2], [4]; r1: [1 2], [3]
  ok(t);
  CHECK(t.stats().nodes == 0);
}

TEST_CASE("an edge longer than the index's 20-bit offsets continues in a child node") {
  PrefixTree t;
  Chain c((1u << 20) + 5);
  for (std::size_t k = 0; k < c.size(); ++k) c[k] = 1000 + k;
  t.insert(0, c, 1);
  CHECK(t.stats().nodes == 2);
  CHECK(t.stats().blocks == c.size());
  CHECK(t.match(c).of(0) == c.size());
  CHECK(t.remove(0, Chain{c[(1u << 20) - 1]}) == 1);  // the last block of the first edge
  CHECK(t.match(c).of(0) == (1u << 20) - 1);
  ok(t);
}
