// Preemption by recompute: the victim, its blocks, its place in the queue, and identical output.
#include <doctest/doctest.h>

#include "sched_test_util.h"

using namespace kvfleet;
using namespace kvfleet::test;
using Ids = std::vector<BlockId>;

TEST_CASE("out of blocks: the latest arrival is preempted, resumes from its cached prefix, same output") {
  Harness h(sched_config(16), kv_config(4));
  const auto p1 = iota_tokens(7), p2 = iota_tokens(7, 100);
  h.add(p1);
  h.add(p2);
  CHECK(h.step() == "1:0+7* 2:0+7*");
  CHECK(h.table(1) == Ids{0, 1});
  CHECK(h.table(2) == Ids{2, 3});
  CHECK(h.step() == "1:7+1* 2:7+1*");  // position 7 still fits; all four blocks are now full and cached
  CHECK(h.sched.kv().cache().size() == 4);

  // 1 needs a fifth block: 2 arrived last, so it goes; freed tail first, its tail is evicted first.
  CHECK(h.step() == "1:8+1* P:2");
  CHECK(h.table(1) == Ids{0, 1, 3});
  CHECK(h.free_list() == Ids{2});
  const Sequence* s2 = h.sched.get(2);
  CHECK(s2->status == SeqStatus::preempted);
  CHECK(s2->num_computed_tokens == 0);
  CHECK(s2->block_table.empty());
  CHECK(s2->num_tokens() == 9);  // prompt + 2 outputs: all to recompute
  CHECK(h.sched.waiting().front() == s2);
  CHECK(h.sched.stats().num_preemptions == 1);
  CHECK(h.sched.stats().kv.evicted_blocks == 1);

  // 2's first block is still cached, but it needs two more blocks than there are: it waits.
  CHECK(h.step() == "1:9+1*");
  CHECK(h.sched.finish(1, FinishReason::length));
  CHECK(h.free_list() == Ids{3, 2, 1, 0});
  CHECK(h.step() == "2:4+5*");  // the prefix hit skips 4 tokens; the recompute ends with a sample
  CHECK(h.table(2) == Ids{2, 3, 1});
  CHECK(h.step() == "2:9+1*");
  CHECK(outputs_of(h.sched, 2) == reference_outputs(p2, 4));
  CHECK(h.sched.finish(2, FinishReason::stop));
  CHECK(h.sched.kv().pool().num_free() == 4);
}

TEST_CASE("a sequence that cannot grow and arrived last preempts itself") {
  Harness h(sched_config(16), kv_config(4));
  h.add(iota_tokens(6));
  h.add(iota_tokens(8, 100));
  CHECK(h.step() == "1:0+6* 2:0+8*");
  CHECK(h.step() == "1:6+1* P:2");
  CHECK(h.free_list() == Ids{3, 2});
  // Both of 2's blocks are cached, but the ninth token needs a third block: it waits.
  CHECK(h.step() == "1:7+1*");
  CHECK(h.sched.get(2)->status == SeqStatus::preempted);
}

TEST_CASE("with priorities the victim is the lowest priority, even when already scheduled this step") {
  Harness h(sched_config(16, 8, true, /*priority=*/true), kv_config(4));
  h.add(iota_tokens(6), 9);
  CHECK(h.step() == "1:0+6*");
  h.add(iota_tokens(8, 100), 0);
  CHECK(h.step() == "1:6+1* 2:0+8*");
  // 1 is scheduled first (position 7 fits), then 2 needs a block: 1 leaves the batch.
  const SchedulerOutput out = h.sched.schedule();
  CHECK(describe(out) == "2:8+1* P:1");
  CHECK(out.num_batched_tokens == 1);
  CHECK(h.sched.check_integrity() == "");
  CHECK(h.table(2) == Ids{2, 3, 1});  // 1's partial block (uncached) went to the front and was reused
  CHECK(h.free_list() == Ids{0});
  h.sched.update(out, h.runner.forward(out.to_forward_batch()));
  CHECK(h.step() == "2:9+1*");  // 1 needs a new block beside its cached first one: none left
  CHECK(h.sched.get(1)->status == SeqStatus::preempted);
}

TEST_CASE("abort in every state frees everything") {
  Harness h(sched_config(8), kv_config(8));
  h.add(iota_tokens(20));
  h.add(iota_tokens(3, 100));
  const SeqId w = h.add(iota_tokens(3, 200));
  CHECK(h.sched.abort(w));  // waiting
  CHECK(h.sched.get(w) == nullptr);
  CHECK(h.sched.check_integrity() == "");
  CHECK(h.step() == "1:0+8");
  CHECK(h.sched.abort(1));  // running, mid-prefill
  CHECK(h.sched.kv().pool().num_free() == 8);
  CHECK(h.sched.check_integrity() == "");
  CHECK(h.step() == "2:0+3*");

  const SchedulerOutput out = h.sched.schedule();  // in flight
  CHECK(describe(out) == "2:3+1*");
  CHECK(h.sched.abort(2));
  h.sched.update(out, h.runner.forward(out.to_forward_batch()));
  CHECK(h.sched.check_integrity() == "");
  CHECK_FALSE(h.sched.abort(2));  // finished
  CHECK_FALSE(h.sched.has_unfinished());

  // preempted
  Harness p(sched_config(16), kv_config(4));
  p.add(iota_tokens(6));
  p.add(iota_tokens(8, 100));
  p.step();
  CHECK(p.step() == "1:6+1* P:2");
  CHECK(p.sched.abort(2));
  CHECK(p.sched.waiting().empty());
  CHECK(p.sched.finish(1, FinishReason::stop));
  CHECK(p.sched.kv().pool().num_free() == 4);
  CHECK(p.sched.check_integrity() == "");
}
