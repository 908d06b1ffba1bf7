// The scheduler's side of speculative decoding: a decode with drafts is one chunk of last token + drafts
// whose every row is wanted; drafts use only the budget left after one token per decode; update() keeps the
// accepted tokens and frees blocks that only rejected drafts reached.
#include <doctest/doctest.h>

#include "sched/sched_test_util.h"

using namespace kvfleet;

namespace {

std::vector<TokenId> prompt_of(std::int32_t n, TokenId first) {
  std::vector<TokenId> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

}  // namespace

TEST_CASE("speculation: drafts ride with their decode, rejected ones leave no block behind") {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 10;
  Scheduler s(sc, test::kv_config(16, 4));
  std::vector<TokenId> drafts{201, 202, 203, 204, 205, 206, 207, 208};
  std::int32_t asked = -1;
  s.set_draft_source([&](const Sequence&, std::int32_t max_drafts, std::vector<TokenId>& out) {
    asked = max_drafts;
    out = drafts;
  });
  const SeqId id = s.add({.id = 0, .prompt = prompt_of(6, 1), .outputs = {}});
  SchedulerOutput out = s.schedule();  // the prompt: no draft source call for a prefill
  CHECK(asked == -1);
  REQUIRE(out.chunks.size() == 1);
  s.update(out, std::vector<TokenId>{100});
  CHECK(s.check_integrity().empty());

  out = s.schedule();
  CHECK(asked == 9);  // budget 10, one token for the decode itself
  REQUIRE(out.chunks.size() == 1);
  const ScheduledChunk& c = out.chunks[0];
  CHECK(c.num_drafts == 8);  // all of them: 9 spare tokens
  CHECK(c.start_pos == 6);
  CHECK(std::vector<TokenId>(c.tokens.begin(), c.tokens.end()) ==
        std::vector<TokenId>{100, 201, 202, 203, 204, 205, 206, 207, 208});
  CHECK(c.sample);
  CHECK(s.get(id)->block_table.size() == 4);  // positions 6 .. 14
  const ForwardBatch batch = out.to_forward_batch();
  CHECK(batch.chunks[0].logits == SeqChunk::Logits::all);
  CHECK(out.num_samples() == 1);
  // Wrong counts are refused.
  CHECK_THROWS_AS(s.update(out, std::vector<TokenId>(10, 1), std::vector<std::int32_t>{10}), std::invalid_argument);
  CHECK_THROWS_AS(s.update(out, std::vector<TokenId>(2, 1), std::vector<std::int32_t>{1}), std::invalid_argument);
  // One draft accepted, then the target's own token: 2 tokens, 8 computed positions, 2 blocks kept.
  s.update(out, std::vector<TokenId>{201, 300}, std::vector<std::int32_t>{2});
  const Sequence& seq = *s.get(id);
  CHECK(seq.tokens == std::vector<TokenId>{1, 2, 3, 4, 5, 6, 100, 201, 300});
  CHECK(seq.num_computed_tokens == 8);
  CHECK(seq.block_table.size() == 3);  // 9 tokens: blocks 0..2; the 4th held only rejected drafts
  CHECK(s.kv().stats().num_free_blocks == 13);
  CHECK(seq.num_cached_blocks == 2);  // positions 0..7 computed and accepted: two full blocks
  CHECK(s.check_integrity().empty());
}

TEST_CASE("speculation: drafts take only the budget left after one token per decode") {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 16;
  Scheduler s(sc, test::kv_config(32, 4));
  std::vector<std::int32_t> asked;
  s.set_draft_source([&](const Sequence&, std::int32_t max_drafts, std::vector<TokenId>& out) {
    asked.push_back(max_drafts);
    out = {7, 7, 7, 7, 7};
  });
  s.add({.id = 0, .prompt = prompt_of(5, 1), .outputs = {}});
  s.add({.id = 0, .prompt = prompt_of(5, 20), .outputs = {}});
  s.add({.id = 0, .prompt = prompt_of(5, 40), .outputs = {}});
  SchedulerOutput out = s.schedule();  // 15 prompt tokens
  s.update(out, std::vector<TokenId>{1, 2, 3});
  out = s.schedule();
  // 16 - 3 decodes = 13 spare: 5 + 5 drafts, then 3 for the third.
  CHECK(asked == std::vector<std::int32_t>{13, 8, 3});
  REQUIRE(out.chunks.size() == 3);
  CHECK(out.chunks[0].num_drafts == 5);
  CHECK(out.chunks[1].num_drafts == 5);
  CHECK(out.chunks[2].num_drafts == 3);
  CHECK(out.num_batched_tokens == 16);
  // All rejected: one token each, no block past the tokens.
  s.update(out, std::vector<TokenId>{9, 9, 9}, std::vector<std::int32_t>{1, 1, 1});
  for (const Sequence* q : s.running()) {
    CHECK(q->num_tokens() == 7);
    CHECK(q->num_computed_tokens == 6);
    CHECK(q->block_table.size() == 2);
  }
  CHECK(s.check_integrity().empty());
}
