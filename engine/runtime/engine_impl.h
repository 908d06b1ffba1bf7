// The engine's private state (kvfleet/engine.h), shared by its three files: engine.cpp (the API any thread
// calls: the inbox), loop.cpp (the engine thread's loop: wait, take the inbox, turn) and step.cpp (one step:
// schedule -> forward -> sample -> update -> outputs).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/kvtier/block_file.h"
#include "engine/kvtier/kv_tiers.h"
#include "engine/runtime/lockstep.h"
#include "engine/runtime/mask_worker.h"
#include "engine/runtime/stop_checker.h"
#include "engine/spec/acceptance.h"
#include "engine/spec/proposer.h"
#include "kernels/cpu/thread_pool.h"
#include "kvfleet/engine.h"
#include "kvfleet/model_runner.h"

namespace kvfleet {

using EngineClock = std::chrono::steady_clock;

struct Engine::Submission {
  RequestId id;
  EngineClock::time_point at;
  GenerationRequest request;
  OutputCallback callback;
  std::unique_ptr<TokenMatcher> matcher;  // made from request.grammar by submit(), off the engine thread
};

// A request while the engine thread owns it.
struct Engine::Active {
  RequestId id = 0;
  GenerationRequest request;
  OutputCallback callback;
  StopChecker stops;
  std::int32_t num_prompt_tokens = 0;  // the prompt itself moved to the scheduler's sequence at admission
  std::string resumed_text;  // the text of GenerationRequest::resumed_outputs, for the first output
  std::vector<KvTierLoad> tier_loads;  // its prefix's lower-tier loads (Sequence::tier_loads), for the first output
  bool admitted = false;
  std::int32_t cached_tokens = 0;
  EngineClock::time_point submitted;
  double queue_time_s = 0.0;
  // With logprobs: the raw logits' alternatives and log Z for the token being sampled, and the raw values
  // of the logits that bias and penalties change (no copy of the row).
  RequestOutput::Logprobs pending_lp;
  double pending_log_z = 0.0;
  std::vector<std::pair<TokenId, float>> raw_logits;
  PenaltyState penalty_state;  // counts of prompt and output tokens, when penalties are on
  // Constrained decoding: the request's matcher (null: unconstrained), the tokens it accepted (always the
  // sequence's output count: a token is accepted once, when it is emitted, never again by a recompute), and
  // the allowed-token mask of the token being sampled (MaskWorker fills it while the forward runs).
  std::unique_ptr<TokenMatcher> matcher;
  std::int32_t accepted = 0;
  std::vector<std::uint32_t> mask;
  std::string mask_error;
  RequestOutput out;           // emit_token's output, reused token after token (no allocation per token)
  bool* delivered = nullptr;   // Impl::delivered: set by every delivery, so that the loop turn ends with outputs_done
  spec::AcceptanceTracker spec;  // speculative decoding: whether this request still proposes
};

// One speculating chunk of a step (spec_step.cpp): its first logits row, and what verification kept: the
// tokens (accepted drafts + the target's token, cut after a stop), their text and logprobs, the stop.
struct SpecJob {
  Engine::Active* active = nullptr;
  const Sequence* seq = nullptr;
  SeqId id = 0;
  std::size_t row = 0;
  std::vector<TokenId> tokens;
  std::string text, stop_string;
  FinishReason reason = FinishReason::none;
  std::vector<RequestOutput::Logprobs> logprobs;
  bool failed = false;
};

// Callbacks run on the engine thread; one that throws must not take the engine (or other requests) down.
void deliver(Engine::Active& a, const RequestOutput& out) noexcept;
// The request's last output: finished with `reason`, the stop checker's held-back text flushed.
void emit_final(Engine::Active& a, FinishReason reason, std::string stop_string = {}, std::string error = {});

struct Engine::Impl {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<kvtier::KvTiers> tiers;  // null without tiers; declared after the scheduler whose hooks it holds
  const Tokenizer* tokenizer = nullptr;
  // Engine thread only: the rows of a step are sampled in parallel (each row's token depends on its own
  // logits and seed alone), with one scratch per share so that no vocabulary-sized buffer is allocated per token,
  // on the backend's host threads (CPU) or on a pool of the engine's own (own_sample_pool: CUDA).
  ThreadPool* sample_pool = nullptr;
  std::unique_ptr<ThreadPool> own_sample_pool;
  std::vector<SamplerScratch> sampler_scratch;

  // Guarded by mu: the inbox and the flags.
  std::mutex mu;
  std::condition_variable wake, idle;
  std::vector<Submission> submissions;
  struct Abort {
    RequestId id;
    std::string error;
  };
  std::vector<Abort> aborts;
  std::optional<std::string> abort_everything;  // abort_all()'s error
  std::vector<std::function<void(KvSnapshot)>> snapshots;  // run on the engine thread, under mu
  std::vector<KvTask> kv_tasks;
  bool stop = false;
  bool busy = false;
  std::atomic<RequestId> next_id{1};
  // How the loop waits and whether a turn steps (alone, or in an expert-parallel group). Declared after mu
  // and wake, which it uses until it is destroyed.
  std::unique_ptr<Lockstep> lockstep;

  // Engine thread only. One id per request: the scheduler's SeqId is the RequestId submit() returned.
  std::unordered_map<RequestId, Active> active;
  // A step's buffers, reused step after step.
  SchedulerOutput scheduled;
  ForwardBatch batch;
  std::vector<TokenId> sampled;
  std::vector<std::pair<SeqId, std::string>> failed;
  std::vector<SampleJob> jobs;
  std::vector<std::string> errors;
  // Speculative decoding (spec_step.cpp): the proposer, whether this step may propose, its speculating chunks,
  // the tokens and counts handed to Scheduler::update, a scratch sequence verification samples against.
  std::unique_ptr<spec::Proposer> proposer;
  bool spec_step = false;
  std::vector<SpecJob> spec_jobs;
  std::vector<TokenId> step_tokens;
  std::vector<std::int32_t> step_counts;
  Sequence spec_seq;
  std::vector<float> spec_p, spec_residual;  // a row's distribution and residual (drafts drawn from q)
  std::uint64_t spec_extra_tokens = 0;  // tokens beyond one per sampling chunk this step
  // The step's constrained rows, whose masks the worker fills while the forward runs.
  std::vector<MaskJob> mask_jobs;
  MaskWorker masks;

  // Wakes the engine thread after a change to the inbox, and the other ranks of a group, whose vote this
  // engine's thread may be waiting for.
  void notify() {
    wake.notify_one();
    lockstep->wake_peers();
  }

  // Engine thread only: set_outputs_done's hook, and whether a callback ran since it last did.
  std::function<void()> outputs_done;
  bool delivered = false;
  void flush_outputs() noexcept {
    if (!std::exchange(delivered, false) || !outputs_done) return;
    try {
      outputs_done();
    } catch (...) {  // like a callback's: it must not take the engine down
    }
  }

  mutable std::mutex stats_mu;
  EngineStats stats;  // guarded by stats_mu
};

}  // namespace kvfleet
