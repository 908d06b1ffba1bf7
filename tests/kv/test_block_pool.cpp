#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "kvfleet/block_pool.h"

using namespace kvfleet;
using Ids = std::vector<BlockId>;

TEST_CASE("a fresh pool hands out blocks in id order") {
  BlockPool pool(4);
  CHECK(pool.free_list() == Ids{0, 1, 2, 3});
  CHECK(pool.pop_free() == 0);
  CHECK(pool.pop_free() == 1);
  CHECK(pool.num_free() == 2);
  CHECK(pool.ref_count(0) == 1);
  CHECK(pool.free_list() == Ids{2, 3});
  CHECK(pool.check_integrity().empty());
}

TEST_CASE("a request's cached blocks are freed tail first, so its tail is evicted first") {
  BlockPool pool(5);
  const Ids request{pool.pop_free(), pool.pop_free(), pool.pop_free()};  // 0 1 2
  for (auto it = request.rbegin(); it != request.rend(); ++it) pool.release(*it, /*cached=*/true);
  // 3 and 4 hold nothing: they go first; then the LRU order of cached blocks, tail block first.
  CHECK(pool.free_list() == Ids{3, 4, 2, 1, 0});
  CHECK(pool.pop_free() == 3);
  CHECK(pool.pop_free() == 4);
  CHECK(pool.pop_free() == 2);
  CHECK(pool.check_integrity().empty());
}

TEST_CASE("an uncached block goes to the front, a cached one to the back") {
  BlockPool pool(4);
  for (int i = 0; i < 4; ++i) pool.pop_free();
  pool.release(1, true);
  pool.release(3, false);
  pool.release(0, true);
  pool.release(2, false);
  CHECK(pool.free_list() == Ids{2, 3, 1, 0});
  pool.move_to_front(0);  // lost its cached content
  CHECK(pool.free_list() == Ids{0, 2, 3, 1});
  CHECK(pool.check_integrity().empty());
}

TEST_CASE("a cache hit revives a free block from the middle of the list") {
  BlockPool pool(5);
  for (int i = 0; i < 5; ++i) pool.pop_free();
  for (BlockId b : {4, 3, 2, 1, 0}) pool.release(b, true);
  REQUIRE(pool.free_list() == Ids{4, 3, 2, 1, 0});
  pool.acquire(2);
  CHECK(pool.free_list() == Ids{4, 3, 1, 0});
  CHECK(pool.ref_count(2) == 1);
  pool.acquire(4);  // the head
  pool.acquire(0);  // the tail
  CHECK(pool.free_list() == Ids{3, 1});
  CHECK(pool.peek_free() == 3);
  CHECK(pool.check_integrity().empty());
}

TEST_CASE("a shared block joins the free list only when its last reference goes") {
  BlockPool pool(2);
  const BlockId b = pool.pop_free();
  pool.acquire(b);
  CHECK(pool.ref_count(b) == 2);
  pool.release(b, true);
  CHECK(pool.free_list() == Ids{1});
  pool.release(b, true);
  CHECK(pool.free_list() == Ids{1, 0});
  CHECK_THROWS_AS(pool.release(b, true), std::logic_error);
  CHECK(pool.check_integrity().empty());
}

TEST_CASE("popping an empty pool throws") {
  BlockPool pool(1);
  pool.pop_free();
  CHECK(pool.peek_free() == kNoBlock);
  CHECK_THROWS_AS(pool.pop_free(), std::logic_error);
  CHECK_THROWS_AS(BlockPool(0), std::invalid_argument);
}
