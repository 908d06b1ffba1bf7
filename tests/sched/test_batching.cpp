// Exact scheduling decisions: budget splits, chunk sizes, decode-first, admission order, priority.
#include <doctest/doctest.h>

#include <stdexcept>

#include "sched_test_util.h"

using namespace kvfleet;
using namespace kvfleet::test;
using Ids = std::vector<BlockId>;

TEST_CASE("chunked prefill splits the budget, decodes go first, blocks follow block boundaries") {
  Harness h(sched_config(10), kv_config(64));
  h.add(iota_tokens(6));
  h.add(iota_tokens(7, 100));
  CHECK(h.step() == "1:0+6* 2:0+4");  // 2 gets what is left of the budget
  CHECK(h.table(1) == Ids{0, 1});
  CHECK(h.table(2) == Ids{2});
  CHECK(h.step() == "1:6+1* 2:4+3*");
  CHECK(h.table(2) == Ids{2, 3});
  CHECK(h.step() == "1:7+1* 2:7+1*");
  CHECK(h.table(1) == Ids{0, 1});  // position 7 still fits block 1
  h.add(iota_tokens(20, 200));
  CHECK(h.step() == "1:8+1* 2:8+1* 3:0+8");
  CHECK(h.table(1) == Ids{0, 1, 4});
  CHECK(h.table(2) == Ids{2, 3, 5});
  CHECK(h.table(3) == Ids{6, 7});
  CHECK(h.step() == "1:9+1* 2:9+1* 3:8+8");
  CHECK(h.step() == "1:10+1* 2:10+1* 3:16+4*");
  CHECK(h.step() == "1:11+1* 2:11+1* 3:20+1*");
  const SchedulerStats st = h.sched.stats();
  CHECK(st.num_running == 3);
  CHECK(st.num_waiting == 0);
  CHECK(st.num_steps == 7);
}

TEST_CASE("the output converts to the runner's ForwardBatch with spans into the sequences") {
  Harness h(sched_config(10), kv_config(64));
  h.add(iota_tokens(6));
  h.add(iota_tokens(7, 100));
  const SchedulerOutput out = h.sched.schedule();
  CHECK(out.num_batched_tokens == 10);
  CHECK(out.num_samples() == 1);
  const ForwardBatch fb = out.to_forward_batch();
  REQUIRE(fb.chunks.size() == 2);
  CHECK(fb.num_tokens() == 10);
  CHECK(std::vector<TokenId>(fb.chunks[1].tokens.begin(), fb.chunks[1].tokens.end()) == iota_tokens(4, 100));
  CHECK(fb.chunks[1].start_pos == 0);
  CHECK(std::vector<BlockId>(fb.chunks[1].block_table.begin(), fb.chunks[1].block_table.end()) == Ids{2});
  CHECK(fb.chunks[0].logits == SeqChunk::Logits::last);
  CHECK(fb.chunks[1].logits == SeqChunk::Logits::none);
  CHECK(fb.chunks[0].tokens.data() == h.sched.get(1)->tokens.data());
  CHECK(&out.chunks[1].sequence() == h.sched.get(2));

  CHECK_THROWS_AS(h.sched.update(out, std::vector<TokenId>{}), std::invalid_argument);
  h.sched.update(out, std::vector<TokenId>{42});
  CHECK(h.sched.get(1)->outputs().back() == 42);
  CHECK(h.sched.get(1)->num_computed_tokens == 6);
  CHECK(h.sched.get(2)->num_computed_tokens == 4);
  CHECK(h.sched.get(2)->num_output_tokens() == 0);
  CHECK_THROWS_AS(h.sched.update(out, std::vector<TokenId>{42}), std::logic_error);  // not the latest output
  SchedulerOutput next;
  next.preempted.push_back(99);  // stale content: schedule(out) starts from a clean slate
  h.sched.schedule(next);
  CHECK_THROWS_AS(h.sched.update(out, std::vector<TokenId>{42}), std::logic_error);
  CHECK(describe(next) == "1:6+1* 2:4+3*");
  CHECK(next.num_batched_tokens == 4);
  ForwardBatch reused = out.to_forward_batch();
  next.to_forward_batch(reused);
  CHECK(reused.chunks.size() == 2);
  CHECK(reused.num_tokens() == 4);
}

TEST_CASE("without chunked prefill a prompt that does not fit waits, and so does everyone behind it") {
  Harness h(sched_config(10, 8, /*chunked=*/false), kv_config(64));
  h.add(iota_tokens(6));
  h.add(iota_tokens(7, 100));
  h.add(iota_tokens(2, 200));
  CHECK(h.step() == "1:0+6*");
  CHECK(h.step() == "1:6+1* 2:0+7* 3:0+2*");
  CHECK_THROWS_AS(h.add(iota_tokens(11)), std::invalid_argument);  // could never be scheduled
  CHECK_THROWS_AS(h.add({}), std::invalid_argument);
}

TEST_CASE("max_num_seqs caps the running set") {
  Harness h(sched_config(100, 2), kv_config(64));
  for (int i = 0; i < 3; ++i) h.add(iota_tokens(3, 10 * i));
  CHECK(h.step() == "1:0+3* 2:0+3*");
  CHECK(h.step() == "1:3+1* 2:3+1*");
  CHECK(h.sched.stats().num_waiting == 1);
  CHECK(h.sched.finish(1, FinishReason::stop));
  CHECK(h.step() == "2:4+1* 3:0+3*");
}

TEST_CASE("admission order: FCFS, or priority (lower first) with ties by arrival") {
  SUBCASE("fcfs") {
    Harness h(sched_config(10), kv_config(64));
    h.add(iota_tokens(4), 5);
    h.add(iota_tokens(4, 10), 1);
    h.add(iota_tokens(4, 20), 1);
    CHECK(h.step() == "1:0+4* 2:0+4* 3:0+2");
  }
  SUBCASE("priority") {
    Harness h(sched_config(10, 8, true, /*priority=*/true), kv_config(64));
    h.add(iota_tokens(4), 5);
    h.add(iota_tokens(4, 10), 1);
    h.add(iota_tokens(4, 20), 1);
    CHECK(h.step() == "2:0+4* 3:0+4* 1:0+2");
    h.add(iota_tokens(4, 30), 0);  // top priority, but running sequences are served first
    CHECK(h.step() == "2:4+1* 3:4+1* 1:2+2* 4:0+4*");
  }
}

TEST_CASE("a 512-token shared prefix: the second request computes only its new tokens") {
  Harness h(sched_config(2048), kv_config(128, 16));
  std::vector<TokenId> a = iota_tokens(512, 1000), b = a;
  const auto tail_a = iota_tokens(8, 5000), tail_b = iota_tokens(20, 7000);
  a.insert(a.end(), tail_a.begin(), tail_a.end());
  b.insert(b.end(), tail_b.begin(), tail_b.end());
  h.add(a);
  CHECK(h.step() == "1:0+520*");
  const KvReplay first = h.sched.kv().events()->since(0);
  REQUIRE(first.events.size() == 1);
  CHECK(first.events[0].seq == 1);
  CHECK(first.events[0].block_hashes.size() == 32);
  CHECK(first.events[0].parent == block_hash_root("tiny-llama"));

  h.add(b);
  CHECK(h.step() == "1:520+1* 2:512+20*");
  const Ids ta = h.table(1), tb = h.table(2);
  CHECK(Ids(tb.begin(), tb.begin() + 32) == Ids(ta.begin(), ta.begin() + 32));
  CHECK(tb.size() == 34);
  const SchedulerStats st = h.sched.stats();
  CHECK(st.kv.prefix_hit_tokens == 512);
  CHECK(st.kv.prefix_query_tokens == 520 + 532);
  // b's 33rd block (positions 512..527) is new: one stored event, parented on the shared prefix.
  const KvReplay second = h.sched.kv().events()->since(1);
  REQUIRE(second.events.size() == 1);
  CHECK(second.events[0].seq == 2);
  const auto hb = block_hashes(block_hash_root("tiny-llama"), b, 16);
  CHECK(second.events[0].block_hashes == std::vector<BlockHash>{hb[32]});
  CHECK(second.events[0].parent == hb[31]);
  CHECK(outputs_of(h.sched, 2) == reference_outputs(b, 1));
}

TEST_CASE("a sequence whose prefix a lower KV tier is loading is passed over until it is in") {
  Harness h(sched_config(100), kv_config(64));
  h.add(iota_tokens(5));
  h.add(iota_tokens(3, 100));
  h.sched.waiting().front()->kv_loading = true;
  CHECK(h.step() == "2:0+3*");  // 1 waits; 2, behind it, goes first
  CHECK(h.step() == "2:3+1*");
  CHECK(h.sched.stats().num_waiting == 1);
  h.sched.waiting().front()->kv_loading = false;
  CHECK(h.step() == "2:4+1* 1:0+5*");
}
