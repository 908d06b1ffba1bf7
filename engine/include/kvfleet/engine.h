// Engine: one thread owns the scheduler, the KV cache, the model runner and the backend; any thread
// submits requests, aborts them, and receives their tokens through a per-request callback.
//
// Each loop turn: take the inbox (submits, aborts, KV tasks) -> the turn (alone: step when there is work; in
// an expert-parallel group: as the ranks' vote says, engine/runtime/lockstep.h) -> step: Scheduler::schedule ->
// ModelRunner::forward -> sample one token per finished chunk -> Scheduler::update -> stop checks -> callbacks.
//
// Thread-safety: submit(), abort(), stats() and kv_events() may be called from any thread. Callbacks run on
// the engine thread: they must be quick and must not call back into the engine synchronously (post the
// output to your own executor instead).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <future>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvfleet/backend.h"
#include "kvfleet/kv_tier_config.h"
#include "kvfleet/model.h"
#include "kvfleet/sampler.h"
#include "kvfleet/scheduler.h"
#include "kvfleet/speculative.h"
#include "kvfleet/token_constraint.h"

namespace kvfleet {

class Communicator;
class Tokenizer;
struct SpecJob;

struct EngineConfig {
  SchedulerConfig scheduler;
  std::int32_t num_blocks = 512;
  std::int32_t block_size = 16;
  bool enable_prefix_caching = true;
  std::string served_model_name;  // the block-hash namespace (Contract 1); default: the model's name
  std::int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
  BackendOptions backend;
  // Expert parallelism (MoE models): this engine is rank ep->rank() of a group whose engines step in
  // lockstep (a rank without work runs an empty step). Each rank has its own requests, scheduler and KV
  // cache; destroying any rank's engine stops the whole group's loops. Null: a plain engine.
  Communicator* ep = nullptr;
  // Speculative decoding (kvfleet/speculative.h, engine/spec/): off unless `speculative.method` is set.
  SpeculativeConfig speculative;
  // KV cache tiers below the device pool (engine/kvtier/): host memory, local disk, a shared directory. Off
  // by default; they need prefix caching.
  KvTierConfig kv_tiers;
  // Tests only, with `speculative` set: proposes a sequence's drafts instead of the configured method (at most
  // k; any tokens, right or wrong).
  std::function<void(const Sequence& seq, std::int32_t k, std::vector<TokenId>& out)> propose_for_test;
  // Tests only: runs on a sampling thread whenever share `share` of a step's sampling claims rows [begin, end),
  // before it samples them (a step samples in shares from 16 rows on). Empty: nothing runs.
  std::function<void(std::int64_t share, std::int64_t begin, std::int64_t end)> on_rows_claimed;
};

struct GenerationRequest {
  std::vector<TokenId> prompt;
  SamplingParams sampling;   // seed: set one for reproducible sampling (greedy ignores it)
  std::int32_t max_tokens = 16;
  bool ignore_eos = false;
  std::vector<TokenId> stop_token_ids;
  std::vector<std::string> stop;  // stop strings; need a tokenizer (Engine::set_tokenizer)
  // The output's text, decoded once on the engine thread (the stream decoder the stop strings are matched
  // on): RequestOutput::text. Needs a tokenizer. skip_special_tokens applies to that text, and so to the
  // text stop strings are matched on.
  bool detokenize = false;
  bool skip_special_tokens = false;
  std::int32_t priority = 0;
  Penalties penalties;
  std::int32_t logprobs = -1;  // >= 0: report each token's logprob and this many top alternatives
  // OpenAI logit_bias: added to the logits of these ids before sampling (ids inside the vocabulary).
  std::vector<std::pair<TokenId, float>> logit_bias;
  // Prefix-cache namespace of a tenant (Contract 1): requests with different salts never share blocks.
  std::string cache_salt;
  // KV transfer (Contract 3): compute the prompt's K/V and sample nothing; at the end the prompt's full
  // blocks are pinned (RequestOutput::pin) until run_kv_task unpins them. The one output is final, with
  // no tokens and FinishReason::length.
  bool prefill_only = false;
  // Resumption (a stream moved from another replica): output tokens already generated and delivered
  // elsewhere. The request continues after them as if it had produced them itself: they count towards
  // max_tokens and the context, penalties see them as output, a seeded sampler's next draw is the one at
  // their count, and the stop checker has read their text (a stop string that spans the splice is still
  // found). The first output carries the text they released (RequestOutput::resumed_text).
  std::vector<TokenId> resumed_outputs;
  // Constrained decoding (structured outputs): every sampled token is one the grammar allows; the grammar's
  // end finishes the request with FinishReason::stop, max_tokens before it with length. Each request owns a
  // matcher made from it (n choices: n requests, n matchers). Null: unconstrained. Its vocab_size must not
  // exceed the model's. Masks are computed on a worker thread while the step's forward runs.
  std::shared_ptr<const TokenGrammar> grammar;
};

using RequestId = std::uint64_t;

// What a request's callback receives: the tokens produced since the last call, and at the end the reason.
struct RequestOutput {
  RequestId id = 0;
  std::vector<TokenId> new_tokens;
  // With GenerationRequest::detokenize: the text new_tokens complete (whole UTF-8 characters; a character
  // split over tokens comes with the token that completes it), and on the final output whatever was still
  // held back. The concatenation over a request's outputs is its decoded text as a client sees it: text that could
  // begin a stop string is held back until later tokens resolve it, and a matched stop string and what follows
  // it are left out.
  std::string text;
  bool finished = false;
  FinishReason finish_reason = FinishReason::none;
  std::string stop_string;           // the stop string that ended it, if any
  std::int32_t num_prompt_tokens = 0;
  std::int32_t num_cached_tokens = 0;  // prompt tokens found in the prefix cache at admission
  std::string error;                 // set when the request failed (finished with aborted)
  double queue_time_s = 0.0;         // from submit() to the first step that computed it
  // With GenerationRequest::logprobs >= 0: one entry per new token.
  struct Logprobs {
    float logprob = 0.0f;
    std::vector<TokenLogprob> top;
  };
  std::vector<Logprobs> logprobs;
  std::uint64_t pin = 0;  // prefill_only: the KvCacheManager pin holding the prompt's full blocks
  // The first output of a request with resumed_outputs: the text those outputs released (what the
  // replica that generated them showed), so that offsets into the whole text stay right. Empty otherwise.
  std::string resumed_text;
  // The first output of a request whose prefix came from lower KV tiers (kv_tier_config.h): those loads.
  std::vector<KvTierLoad> kv_tier_loads;
};

using OutputCallback = std::function<void(const RequestOutput&)>;

// MoE models: how the routed tokens spread over the experts.
struct MoeLoadStats {
  std::vector<std::uint64_t> expert_tokens;  // [num_experts] tokens routed to each, summed over sparse layers
  std::uint64_t steps = 0;                   // steps that routed tokens
  double last_imbalance = 0.0;  // the last such step: max / mean of its tokens per expert (1: even; E: one expert)
  double imbalance_sum = 0.0;   // summed over those steps (mean = imbalance_sum / steps)
  // Adds one step's counts, [layers][num_experts] as ModelRunner::expert_tokens gives them. An expert-parallel
  // rank counts only the experts it holds, [first, first + held): the imbalance is over those.
  void add_step(const std::vector<std::int32_t>& per_layer_counts, std::int64_t num_experts, std::int64_t first = 0,
                std::int64_t held = 0);
};

// Speculative decoding's counts (vLLM's spec_decode metrics): verified drafts, their tokens, the accepted ones,
// and accepted tokens by position in the draft ([0]: first drafts accepted).
struct SpecDecodeStats {
  std::string method;  // empty: speculation off
  std::uint64_t num_drafts = 0, num_draft_tokens = 0, num_accepted_tokens = 0;
  std::vector<std::uint64_t> accepted_per_pos;
};

struct EngineStats {
  SchedulerStats scheduler;
  std::uint64_t prompt_tokens = 0;      // prompt tokens computed (prefix-cache hits excluded)
  std::uint64_t generated_tokens = 0;
  std::uint64_t steps = 0;
  // Wall time of the steps that ran a forward pass: all of each step, and the forward pass within it. The
  // difference is the engine's own work (schedule, sample, stop check, outputs).
  double step_seconds = 0.0, forward_seconds = 0.0;
  std::array<std::uint64_t, 4> finished{};  // by FinishReason (none unused)
  MoeLoadStats moe;  // empty expert_tokens for a dense model
  SpecDecodeStats spec;
  KvTierStats kv_tiers;  // all zero without tiers
};

class Engine {
 public:
  Engine(const Model& model, const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Optional: enables stop strings (decoded incrementally). Call before the first submit.
  void set_tokenizer(const Tokenizer* tokenizer);
  // Optional, before the first submit: runs on the engine thread once at the end of every loop turn in which
  // output callbacks ran (a step's tokens, aborts, failures, the shutdown's final outputs), after the last of
  // them and inside the step's time. A consumer whose callbacks only queue their output wakes its readers
  // here, once per step, instead of once per output (the replica's OutputRelay). The rules of a callback
  // apply; an exception it throws is dropped.
  void set_outputs_done(std::function<void()> done);

  // Queues a request. Throws std::invalid_argument for a request that can never run (empty prompt, bad
  // sampling values, prompt + max_tokens beyond max_model_len, a prompt longer than the whole cache, or
  // than max_num_batched_tokens without chunked prefill). Nothing a request holds can stop the engine:
  // an exception while it is scheduled, computed, sampled or checked ends that request alone, with
  // RequestOutput::error set.
  RequestId submit(GenerationRequest request, OutputCallback on_output);
  // Ends a request in any state; its callback gets a final output with FinishReason::aborted. Unknown or
  // finished ids are ignored.
  void abort(RequestId id);
  // Ends every request in the engine, each with RequestOutput::error = `error` (a drain that timed out).
  void abort_all(std::string error);

  EngineStats stats() const;
  std::shared_ptr<KvEventRing> kv_events() const { return kv_events_; }
  const EngineConfig& config() const { return config_; }
  std::int64_t max_model_len() const { return max_model_len_; }
  // Blocks until no request is queued or running (tests, the offline tool).
  void wait_idle();
  // Expert parallelism: blocks until every rank of the group called leave_group() and none has work left,
  // then the group's loops end together (this rank's experts serve the others until then). Afterwards the
  // engine takes no more requests. Without a group: wait_idle().
  void leave_group();
  // Everything the prefix cache holds, taken on the engine thread (blocks until the next loop turn): what
  // a KV-event reader that fell behind the ring starts from (Contract 2).
  KvSnapshot kv_snapshot();
  // The same without blocking: `done` runs on the engine thread at its next loop turn, under the engine's
  // inbox lock (post the result elsewhere; do not call into the engine). Never runs if the engine stops first.
  void kv_snapshot(std::function<void(KvSnapshot)> done);
  // Runs `task` on the engine thread at its next loop turn, between steps, with the scheduler (its KV
  // cache: pins, imports, integrity checks) and the backend (block bytes): how engine/pd reads and writes
  // KV blocks safely. Tasks run in submission order; ones still queued at shutdown run before the thread
  // ends. A task must be quick and must not block on the engine.
  using KvTask = std::function<void(Scheduler& scheduler, Backend& backend)>;
  void run_kv_task(KvTask task);

 private:
  struct Impl;
  struct Submission;
  struct Inbox;

 public:
  struct Active;  // opaque: a request while the engine thread owns it (engine.cpp's helpers name it)

 private:
  void loop();  // loop.cpp: the engine thread
  bool take_inbox(Inbox& inbox);
  void apply(Inbox& inbox);
  bool run_turn(bool stopping);
  void shut_down();
  void admit(Submission& s);
  void step();  // step.cpp: schedule -> forward -> sample -> update -> outputs
  void pause_empty_step();
  void start_masks();
  bool forward_scheduled(std::span<float>& logits);
  void collect_sample_jobs(std::uint64_t& prompt_tokens, std::size_t& prefill_only);
  void emit_step_outputs();
  void serve_peers();
  TokenId sample_row(Active& a, const Sequence& seq, std::span<float> row, SamplerScratch& scratch) const;
  void prepare_row(Active& a, const Sequence& seq, std::span<float> row, SamplerScratch& scratch) const;
  void chose_row(Active& a, std::span<const float> row, TokenId chosen) const;
  struct SampleJob {
    Active* active;
    const Sequence* seq;
    SeqId id;
    std::size_t row, slot;  // the row of the step's logits; the index in the step's sampled tokens
  };
  void sample_rows(std::vector<SampleJob>& jobs, std::span<float> logits, std::size_t vocab,
                   std::vector<TokenId>& sampled, std::vector<std::pair<SeqId, std::string>>& failed);
  void emit_token(SeqId seq, TokenId token);
  // spec_step.cpp: speculative decoding's part of a step (engine/spec/proposer.h).
  void set_up_speculation();
  void begin_spec_step();
  void propose_drafts(const Sequence& seq, std::int32_t max_drafts, std::vector<TokenId>& out);
  void verify_drafts(std::span<float> logits, std::size_t vocab);
  std::int32_t verify_sampled_drafts(SpecJob& job, std::span<const TokenId> drafts, std::span<const float> q,
                                     std::span<float> logits, std::size_t vocab, std::vector<TokenId>& emitted);
  void update_with_drafts();
  void emit_speculated(const ScheduledChunk& c, std::size_t job);
  void end_speculation(SeqId id, const Active& a);
  void count_experts();
  void fail(SeqId seq, const std::string& error);
  void fail_all(const std::string& error);
  void finish_prefill_only(SeqId id, const Sequence& seq);
  void count_finished(FinishReason reason);

  const Model& model_;
  EngineConfig config_;
  std::int64_t max_model_len_ = 0;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<KvEventRing> kv_events_;
  std::thread thread_;
};

}  // namespace kvfleet
