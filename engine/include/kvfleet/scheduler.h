// Scheduler: continuous batching over a paged KV cache. Plain data out, no device calls.
//
// The engine thread drives it, one step at a time:
//   out = scheduler.schedule();                 // who computes which tokens this step
//   runner.forward(out.to_forward_batch());     // K/V written through the block tables
//   tokens = sampler(...);                      // one token per chunk with `sample` set, in order
//   scheduler.update(out, tokens);              // advance, commit full blocks, append tokens
//   (speculating chunks: update(out, tokens, counts), 1 to num_drafts + 1 tokens for such a chunk)
//   for each sequence that hit a stop: scheduler.finish(id, reason);
// add() and abort() come between steps (requests arrive through the engine's queue).
//
// A step, within max_num_seqs running sequences and max_num_batched_tokens tokens:
//   1. decodes: running sequences with one token to compute, in admission order;
//   2. running sequences still in their prompt (chunked prefill): the rest of it, cut to the
//      remaining budget;
//   3. if nothing was preempted this step: waiting sequences, in order of (priority when
//      use_priority, then arrival), each first matched against the prefix cache; the first one
//      that does not fit (blocks, budget, or the seq limit) stops admission (no overtaking). A sequence
//      whose prefix a lower KV tier is still loading (Sequence::kv_loading) is passed over.
// Speculative decoding (engine/spec/proposer.h): with a draft source set, a decode may carry drafts: its last
// token + d drafts form one chunk of d + 1 tokens whose every row is sampled. Drafts only use budget left
// after one token per decode, and a sequence whose blocks for the drafts are not free decodes plainly:
// speculation never preempts anyone.
// When a running sequence cannot get its blocks, the running sequence with the largest
// (priority, arrival) is preempted by recompute (possibly itself): blocks freed, back into the
// waiting queue at its (priority, arrival) place, which under FCFS is the front.
//
// Not thread-safe: the engine thread owns the scheduler (KvCacheManager::events() excepted).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvfleet/forward_batch.h"
#include "kvfleet/kv_cache_manager.h"
#include "kvfleet/sequence.h"

namespace kvfleet {

struct SchedulerConfig {
  std::int32_t max_num_seqs = 256;
  std::int32_t max_num_batched_tokens = 2048;
  bool enable_chunked_prefill = true;  // off: a prompt that does not fit the remaining budget waits
  bool use_priority = false;           // on: lower SequenceParams::priority first, ties by arrival
};

// One sequence's share of a step. The spans point into the scheduler's sequences and stay valid
// until the next call of update(), finish(), abort() or schedule(); sequence() until the next
// schedule() (a sequence finished in between stays readable until then).
struct ScheduledChunk {
  SeqId id = 0;
  std::int32_t start_pos = 0;
  std::span<const TokenId> tokens;       // positions [start_pos, start_pos + tokens.size())
  std::span<const BlockId> block_table;  // the sequence's whole table
  bool sample = false;                   // reaches the end of the known tokens: logits, one token
  // Speculation: tokens = the last known token + num_drafts drafts (Sequence::verify_tokens); every row's
  // logits are wanted and update() takes 1 to num_drafts + 1 tokens for the chunk.
  std::int32_t num_drafts = 0;
  std::span<const TokenId> drafts() const { return tokens.subspan(tokens.empty() ? 0 : 1); }

  // The sequence itself (outputs so far for penalties and stop checks), read-only.
  const Sequence& sequence() const { return *seq_; }

 private:
  friend class Scheduler;
  Sequence* seq_ = nullptr;
};

struct SchedulerOutput {
  std::uint64_t step = 0;
  std::vector<ScheduledChunk> chunks;  // decodes, then continued prefills, then admissions
  std::vector<SeqId> preempted;        // preempted during this step (not in chunks)
  std::int32_t num_batched_tokens = 0;

  bool empty() const { return chunks.empty(); }
  std::size_t num_samples() const;
  ForwardBatch to_forward_batch() const;
  // Same, into `batch`, reusing its memory (the engine's hot path).
  void to_forward_batch(ForwardBatch& batch) const;
};

struct SchedulerStats {
  std::int32_t num_running = 0;
  std::int32_t num_waiting = 0;  // preempted ones included
  std::uint64_t num_preemptions = 0;
  std::uint64_t num_steps = 0;
  KvCacheStats kv;
};

// Why a prompt of `prompt_len` tokens could never be scheduled, or an empty string when it can: with its first
// sampled token it must fit the whole KV cache (num_blocks x block_size tokens), and with chunked prefill off
// one step's token budget. Engine::submit refuses such a request with these words; Scheduler::add throws them.
std::string why_never_schedulable(std::int64_t prompt_len, const SchedulerConfig& config, std::int64_t num_blocks,
                                  std::int32_t block_size);

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config);

  // Queues a request; returns its id (SequenceParams::id, or else ids count up from 1 in arrival order). Throws
  // std::invalid_argument for an empty prompt or one that could never be scheduled. The engine
  // caps max_tokens so that prompt + outputs fit the whole cache (num_blocks * block_size tokens):
  // a sequence that outgrows it is preempted and can never be admitted again.
  SeqId add(SequenceParams params);

  SchedulerOutput schedule();
  // Same, into `out` (cleared first), reusing its memory step after step.
  void schedule(SchedulerOutput& out);
  // `sampled` holds one token per chunk with `sample` set, in chunk order. Sequences finished or
  // aborted since `out` was made are skipped.
  void update(const SchedulerOutput& out, std::span<const TokenId> sampled);
  // Same with `counts[i]` tokens for the i-th sampling chunk (1 for a plain one, 1 to num_drafts + 1 for a
  // speculating one: the accepted drafts, then the target's token), back to back in `sampled`. A speculating
  // sequence advances by counts[i] computed tokens; blocks wholly past its tokens are freed (the rejected
  // drafts' K/V leaves no trace: only full blocks of computed tokens are ever committed).
  void update(const SchedulerOutput& out, std::span<const TokenId> sampled, std::span<const std::int32_t> counts);

  // Where decodes get their drafts: called during schedule() for each running decode, with the most drafts
  // the step's budget leaves it; writes up to that many into `out` (cleared), none to decode plainly.
  using DraftSource = std::function<void(const Sequence& seq, std::int32_t max_drafts, std::vector<TokenId>& out)>;
  void set_draft_source(DraftSource source) { draft_source_ = std::move(source); }
  // Ends a sequence in any state and frees its blocks; false when the id is unknown or already
  // finished. abort(id) is finish(id, FinishReason::aborted).
  bool finish(SeqId id, FinishReason reason);
  bool abort(SeqId id) { return finish(id, FinishReason::aborted); }

  // nullptr once finished.
  const Sequence* get(SeqId id) const;
  bool has_unfinished() const { return !seqs_.empty(); }
  std::span<const Sequence* const> running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  SchedulerStats stats() const;
  KvCacheManager& kv() { return kv_; }
  const KvCacheManager& kv() const { return kv_; }

  // Empty when queues, statuses and the KV cache agree; otherwise what is wrong.
  std::string check_integrity() const;

 private:
  bool before(const Sequence& a, const Sequence& b) const;
  void insert_waiting(Sequence* seq);
  void schedule_running(Sequence* seq, std::int32_t num_tokens, std::int32_t& budget, SchedulerOutput& out);
  void admit_waiting(std::int32_t& budget, SchedulerOutput& out);
  void preempt(Sequence* victim, std::int32_t& budget, SchedulerOutput& out);
  Sequence* pick_victim() const;
  static void push_chunk(Sequence* seq, std::int32_t num_tokens, std::int32_t& budget, SchedulerOutput& out);
  void schedule_decodes(std::int32_t& budget, SchedulerOutput& out);
  bool schedule_with_drafts(Sequence* seq, std::int32_t& spare, std::int32_t& budget, SchedulerOutput& out);

  const SchedulerConfig config_;
  KvCacheManager kv_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;   // sorted by before()
  // Sequences finished since the last schedule(): kept alive so an output in flight stays valid.
  std::vector<std::unique_ptr<Sequence>> retired_;
  SeqId next_id_ = 1;
  std::uint64_t arrivals_ = 0;  // Scheduler::add calls so far: a sequence's arrival
  std::uint64_t step_ = 0;
  std::uint64_t applied_step_ = 0;  // the last step update() applied: each output applies once
  std::uint64_t num_preemptions_ = 0;
  DraftSource draft_source_;
  std::vector<TokenId> drafts_;  // the draft source's answer, reused
};

}  // namespace kvfleet
