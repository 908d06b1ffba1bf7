// Test harness for the scheduler: a fake model runner that really writes and reads "K/V" (the
// token ids themselves) through the block tables, so a wrong table, a skipped recompute or a bad
// cache hit changes the sampled tokens; and a step driver that checks integrity before and after.
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../kv/kv_test_util.h"  // iota_tokens
#include "kvfleet/scheduler.h"

namespace kvfleet::test {

class FakeRunner {
 public:
  FakeRunner(std::int32_t num_blocks, std::int32_t block_size)
      : block_size_(block_size), slots_(static_cast<std::size_t>(num_blocks * block_size), -1) {}

  // Writes every chunk's tokens into its slots, then "attends": the next token is a hash of the
  // whole context read back through the block table.
  std::vector<TokenId> forward(const ForwardBatch& batch) {
    std::vector<TokenId> sampled;
    for (const SeqChunk& c : batch.chunks) {
      for (std::size_t j = 0; j < c.tokens.size(); ++j) {
        slot(c.block_table, c.start_pos + static_cast<std::int32_t>(j)) = c.tokens[j];
      }
    }
    for (const SeqChunk& c : batch.chunks) {
      if (c.logits == SeqChunk::Logits::none) continue;
      std::vector<TokenId> context;
      const std::int32_t end = c.start_pos + static_cast<std::int32_t>(c.tokens.size());
      for (std::int32_t p = 0; p < end; ++p) context.push_back(slot(c.block_table, p));
      sampled.push_back(next_token(context));
    }
    return sampled;
  }

  static TokenId next_token(std::span<const TokenId> context) {
    return static_cast<TokenId>(block_hash_next(0, context) % 1000);
  }

 private:
  TokenId& slot(std::span<const BlockId> table, std::int32_t pos) {
    const BlockId b = table[static_cast<std::size_t>(pos / block_size_)];
    return slots_[static_cast<std::size_t>(b * block_size_ + pos % block_size_)];
  }
  std::int32_t block_size_;
  std::vector<TokenId> slots_;
};

inline KvCacheConfig kv_config(std::int32_t num_blocks, std::int32_t block_size = 4, bool prefix_caching = true) {
  KvCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.root = block_hash_root("tiny-llama");
  c.enable_prefix_caching = prefix_caching;
  return c;
}

inline SchedulerConfig sched_config(std::int32_t max_num_batched_tokens, std::int32_t max_num_seqs = 8,
                                    bool chunked = true, bool priority = false) {
  SchedulerConfig c;
  c.max_num_batched_tokens = max_num_batched_tokens;
  c.max_num_seqs = max_num_seqs;
  c.enable_chunked_prefill = chunked;
  c.use_priority = priority;
  return c;
}

// "id:start+len" per chunk, '*' when it samples; then " P:id" per preempted sequence.
inline std::string describe(const SchedulerOutput& out) {
  std::string s;
  for (const ScheduledChunk& c : out.chunks) {
    if (!s.empty()) s += ' ';
    s += std::to_string(c.id) + ':' + std::to_string(c.start_pos) + '+' + std::to_string(c.tokens.size());
    if (c.sample) s += '*';
  }
  for (const SeqId id : out.preempted) s += " P:" + std::to_string(id);
  return s;
}

struct Harness {
  Harness(const SchedulerConfig& sc, const KvCacheConfig& kc) : sched(sc, kc), runner(kc.num_blocks, kc.block_size) {}

  SeqId add(std::vector<TokenId> prompt, std::int32_t priority = 0) {
    SequenceParams p;
    p.prompt = std::move(prompt);
    p.priority = priority;
    return sched.add(std::move(p));
  }

  // One engine step; returns describe() of what was scheduled.
  std::string step() {
    const SchedulerOutput out = sched.schedule();
    REQUIRE(sched.check_integrity() == "");
    const std::string what = describe(out);
    sched.update(out, runner.forward(out.to_forward_batch()));
    REQUIRE(sched.check_integrity() == "");
    return what;
  }

  std::vector<BlockId> table(SeqId id) const { return sched.get(id)->block_table; }
  std::vector<BlockId> free_list() const { return sched.kv().pool().free_list(); }

  Scheduler sched;
  FakeRunner runner;
};

// The outputs `prompt` gets when it runs alone, with room to spare and no prefix cache.
inline std::vector<TokenId> reference_outputs(const std::vector<TokenId>& prompt, int num_outputs) {
  Harness h(sched_config(4096), kv_config(256, 4, false));
  const SeqId id = h.add(prompt);
  while (h.sched.get(id)->num_output_tokens() < num_outputs) h.step();
  const auto out = h.sched.get(id)->outputs();
  return {out.begin(), out.end()};
}

inline std::vector<TokenId> outputs_of(const Scheduler& s, SeqId id) {
  const auto out = s.get(id)->outputs();
  return {out.begin(), out.end()};
}

}  // namespace kvfleet::test
