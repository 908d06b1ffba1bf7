#include "kvfleet/engine.h"

#include <cstdio>
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "kernels/cpu/thread_pool.h"
#include "kvfleet/communicator.h"
#include "kvfleet/model_runner.h"
#include "kvfleet/tokenizer.h"
#include "engine/runtime/stop_checker.h"

namespace kvfleet {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct Engine::Submission {
  RequestId id;
  Clock::time_point at;
  GenerationRequest request;
  OutputCallback callback;
};

// A request while the engine thread owns it.
struct Engine::Active {
  RequestId id = 0;
  GenerationRequest request;
  OutputCallback callback;
  StopChecker stops;
  bool admitted = false;
  std::int32_t cached_tokens = 0;
  Clock::time_point submitted;
  double queue_time_s = 0.0;
  // With logprobs: the raw logits' alternatives and log Z for the token being sampled, and the raw values
  // of the logits that bias and penalties change (no copy of the row).
  RequestOutput::Logprobs pending_lp;
  double pending_log_z = 0.0;
  std::vector<std::pair<TokenId, float>> raw_logits;
  PenaltyState penalty_state;  // counts of prompt and output tokens, when penalties are on
  RequestOutput out;           // emit_token's output, reused token after token (no allocation per token)
  bool* delivered = nullptr;   // Impl::delivered: set by every delivery, so that the loop turn ends with outputs_done
};

namespace {
using Active = Engine::Active;

// Callbacks run on the engine thread; one that throws must not take the engine (or other requests) down.
void deliver(Active& a, const RequestOutput& out) noexcept {
  if (a.delivered) *a.delivered = true;
  try {
    if (a.callback) a.callback(out);
  } catch (...) {
  }
}

void emit_final(Active& a, FinishReason reason, std::string stop_string = {}, std::string error = {}) {
  RequestOutput out;
  out.id = a.id;
  out.finished = true;
  out.finish_reason = reason;
  out.stop_string = std::move(stop_string);
  out.text = a.stops.flush();
  out.num_prompt_tokens = static_cast<std::int32_t>(a.request.prompt.size());
  out.num_cached_tokens = a.cached_tokens;
  out.error = std::move(error);
  out.queue_time_s = a.queue_time_s;
  deliver(a, out);
}

// Ids the tokenizer cannot show (a vocabulary padded past the tokenizer, as Qwen2's 151,936 rows for
// 151,665 tokens) are never meant to be sampled: their logits become -inf before anything else.
void mask_unshowable(std::span<float> row, std::size_t showable) {
  for (std::size_t i = showable; i < row.size(); ++i) row[i] = -std::numeric_limits<float>::infinity();
}

// NaN or +inf anywhere in the row, on the bits (an integer reduction the compiler vectorises).
bool all_finite_or_masked(std::span<const float> row) {
  std::uint32_t bad = 0;
  for (float l : row) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(l);
    bad |= static_cast<std::uint32_t>((u & 0x7fffffffu) > 0x7f800000u) | static_cast<std::uint32_t>(u == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace

struct Engine::Impl {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Scheduler> scheduler;
  const Tokenizer* tokenizer = nullptr;
  // Engine thread only: the rows of a step are sampled in parallel (each row's token depends on its own
  // logits and seed alone), with one scratch per share so that no vocabulary-sized buffer is allocated per token.
  std::unique_ptr<ThreadPool> sample_pool;
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
  bool rung = false;  // expert parallelism: another rank rang (it has work, or is stopping)
  bool leave = false;  // expert parallelism: stop once every rank asked to and none has work (leave_group)
  bool leave_news = false;  // leave was set and the idle group has not been told yet
  std::atomic<RequestId> next_id{1};

  // Engine thread only. One id per request: the scheduler's SeqId is the RequestId submit() returned.
  std::unordered_map<RequestId, Active> active;
  // A step's buffers, reused step after step.
  SchedulerOutput scheduled;
  ForwardBatch batch;
  std::vector<TokenId> sampled;
  std::vector<std::pair<SeqId, std::string>> failed;
  std::vector<SampleJob> jobs;
  std::vector<std::string> errors;
  bool group_idle = false;  // expert parallelism: the last vote found no work on any rank
  int idle_poll_ms = 1;     // expert parallelism without ring(): the idle group's vote interval
  std::string ep_failed;    // expert parallelism: the group broke (a collective failed); why

  // Wakes the engine thread after a change to the inbox; under expert parallelism also the other ranks,
  // whose vote this engine's thread may be waiting for.
  void notify(Communicator* ep) {
    wake.notify_one();
    if (ep) ep->ring();
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

Engine::Engine(const Model& model, const EngineConfig& config)
    : model_(model), config_(config), impl_(std::make_unique<Impl>()) {
  const ModelConfig& mc = model.config();
  max_model_len_ = config.max_model_len > 0 ? std::min(config.max_model_len, mc.max_position_embeddings)
                                            : mc.max_position_embeddings;
  if (config_.served_model_name.empty()) config_.served_model_name = model.name();
  impl_->backend = make_backend(config.backend);
  RunnerOptions ro;
  ro.num_blocks = config.num_blocks;
  ro.block_size = config.block_size;
  ro.max_batch_tokens = config.scheduler.max_num_batched_tokens;
  ro.ep = config.ep;
  impl_->runner = std::make_unique<ModelRunner>(model, *impl_->backend, ro);
  // The CUDA backend picks its KV dtype from the checkpoint; a different explicit request is an error,
  // not a silent change of what the blocks hold.
  if (const auto want = parse_kv_cache_dtype(config.backend.kv_cache_dtype); want && *want != impl_->backend->kv_dtype())
    throw std::invalid_argument("kv_cache_dtype " + config.backend.kv_cache_dtype + ": the " +
                                std::string(impl_->backend->name()) + " backend keeps this model's KV cache in " +
                                std::string(dtype_name(impl_->backend->kv_dtype())));
  KvCacheConfig kv;
  kv.num_blocks = config.num_blocks;
  kv.block_size = config.block_size;
  kv.root = block_hash_root(config_.served_model_name);
  kv.enable_prefix_caching = config.enable_prefix_caching;
  impl_->scheduler = std::make_unique<Scheduler>(config.scheduler, kv);
  kv_events_ = impl_->scheduler->kv().events();
  if (config_.ep && config_.ep->can_ring()) {
    config_.ep->set_ring_handler([m = impl_.get()] {
      {
        std::lock_guard lock(m->mu);
        m->rung = true;
      }
      m->wake.notify_one();
    });
  }
  thread_ = std::thread([this] { loop(); });
}

void Engine::leave_group() {
  if (!config_.ep) return wait_idle();
  {
    std::lock_guard lock(impl_->mu);
    impl_->leave = true;
    impl_->leave_news = true;
  }
  impl_->notify(config_.ep);
  if (thread_.joinable()) thread_.join();
}

Engine::~Engine() {
  if (!thread_.joinable()) {  // left its group already
    if (config_.ep) config_.ep->set_ring_handler(nullptr);
    return;
  }
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  if (config_.ep) config_.ep->ring();
  thread_.join();
  if (config_.ep) config_.ep->set_ring_handler(nullptr);
}

void Engine::set_tokenizer(const Tokenizer* tokenizer) { impl_->tokenizer = tokenizer; }

void Engine::set_outputs_done(std::function<void()> done) { impl_->outputs_done = std::move(done); }

RequestId Engine::submit(GenerationRequest r, OutputCallback on_output) {
  if (r.prompt.empty()) throw std::invalid_argument("prompt must not be empty");
  r.sampling.validate();
  if (r.max_tokens < 1) throw std::invalid_argument("max_tokens must be at least 1");
  const auto vocab = model_.config().vocab_size;
  for (TokenId t : r.prompt)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument("prompt token id " + std::to_string(t) + " is outside the vocabulary (size " +
                                  std::to_string(vocab) + ")");
  const auto prompt_len = static_cast<std::int64_t>(r.prompt.size());
  if (prompt_len + 1 > max_model_len_)
    throw std::invalid_argument("the prompt has " + std::to_string(prompt_len) + " tokens; this model's context is " +
                                std::to_string(max_model_len_) + " tokens");
  if (prompt_len + 1 > std::int64_t{config_.num_blocks} * config_.block_size)
    throw std::invalid_argument("the prompt has " + std::to_string(prompt_len) + " tokens, more than the KV cache holds");
  if (!config_.scheduler.enable_chunked_prefill && prompt_len > config_.scheduler.max_num_batched_tokens)
    throw std::invalid_argument("the prompt has " + std::to_string(prompt_len) +
                                " tokens, more than max_num_batched_tokens (" +
                                std::to_string(config_.scheduler.max_num_batched_tokens) +
                                ") with chunked prefill off");
  for (const auto& [t, bias] : r.logit_bias)
    if (t < 0 || t >= vocab || !std::isfinite(bias))
      throw std::invalid_argument("logit_bias: token id " + std::to_string(t) + " is outside the vocabulary or its bias is not finite");
  if (!r.stop.empty() && !impl_->tokenizer) throw std::invalid_argument("stop strings need a tokenizer");
  if (r.detokenize && !impl_->tokenizer) throw std::invalid_argument("detokenize needs a tokenizer");
  const RequestId id = impl_->next_id++;
  {
    std::lock_guard lock(impl_->mu);
    impl_->submissions.push_back({id, Clock::now(), std::move(r), std::move(on_output)});
  }
  impl_->notify(config_.ep);
  return id;
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->aborts.push_back({id, {}});
  }
  impl_->notify(config_.ep);
}

void Engine::abort_all(std::string error) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->abort_everything = std::move(error);
  }
  impl_->notify(config_.ep);
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->stats_mu);
  return impl_->stats;
}

KvSnapshot Engine::kv_snapshot() {
  auto promise = std::make_shared<std::promise<KvSnapshot>>();
  std::future<KvSnapshot> f = promise->get_future();
  kv_snapshot([promise](KvSnapshot snap) { promise->set_value(std::move(snap)); });
  return f.get();
}

void Engine::kv_snapshot(std::function<void(KvSnapshot)> done) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->snapshots.push_back(std::move(done));
  }
  impl_->notify(config_.ep);
}

void Engine::run_kv_task(KvTask task) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->kv_tasks.push_back(std::move(task));
  }
  impl_->notify(config_.ep);
}

void Engine::wait_idle() {
  std::unique_lock lock(impl_->mu);
  impl_->idle.wait(lock, [&] { return impl_->submissions.empty() && impl_->aborts.empty() && !impl_->busy; });
}

void Engine::loop() {
  Impl& m = *impl_;
  Scheduler& sched = *m.scheduler;
  for (;;) {
    m.flush_outputs();  // the last turn's outputs (aborts, failures, a step's tokens) are all delivered
    std::vector<Submission> subs;
    std::vector<Impl::Abort> aborts;
    std::optional<std::string> abort_everything;
    std::vector<KvTask> tasks;
    bool stopping = false;
    bool ring_group = false;
    {
      std::unique_lock lock(m.mu);
      m.busy = sched.has_unfinished();
      if (!m.busy && m.submissions.empty() && m.aborts.empty()) m.idle.notify_all();
      const auto ready = [&] {
        return m.stop || !m.submissions.empty() || !m.aborts.empty() || !m.snapshots.empty() ||
               m.abort_everything || !m.kv_tasks.empty() || sched.has_unfinished();
      };
      const bool in_group = config_.ep && m.ep_failed.empty();
      if (in_group && m.group_idle && config_.ep->can_ring()) {
        // The whole group is idle: sleep until this rank has something or another rank rang. A ring for
        // a vote this rank has already taken (a ticket that came while it was on its way to that vote)
        // is not a reason to vote again: rank 0 would not come, and the group would wait forever.
        m.wake.wait(lock, [&] { return ready() || m.leave_news || (m.rung && config_.ep->vote_requested()); });
        ring_group = ready() || m.leave_news;  // this rank's news: the other ranks must come to the vote too
        m.leave_news = false;
      } else if (in_group) {
        // The group's vote cannot wait for news it cannot be rung about (Gloo: other processes): vote every
        // millisecond while the group works, backing off to 8 ms while it stays idle (at most that much
        // latency for a request that arrives at an idle group).
        m.wake.wait_for(lock, std::chrono::milliseconds(m.group_idle ? m.idle_poll_ms : 1), ready);
        m.idle_poll_ms = m.group_idle ? std::min(2 * m.idle_poll_ms, 8) : 1;
      } else {
        m.wake.wait(lock, [&] { return ready() || (config_.ep && m.leave); });
      }
      m.rung = false;
      stopping = m.stop;
      if ((m.stop || (config_.ep && m.leave)) && !in_group) break;  // a broken group has nobody to wait for
      for (auto& done : m.snapshots) {
        try {
          done(sched.kv().snapshot());
        } catch (const std::exception& e) {  // the reader goes without; the engine goes on
          std::fprintf(stderr, "kvfleet: KV snapshot failed: %s\n", e.what());
        }
      }
      m.snapshots.clear();
      subs.swap(m.submissions);
      aborts.swap(m.aborts);
      abort_everything.swap(m.abort_everything);
      tasks.swap(m.kv_tasks);
      m.busy = true;
    }
    for (auto& s : subs) admit(s);
    for (const auto& a : aborts)
      fail(a.id, a.error);
    if (abort_everything) fail_all(*abort_everything);
    for (auto& task : tasks) task(sched, *m.backend);
    if (ring_group) config_.ep->ring();
    if (config_.ep && m.ep_failed.empty()) {
      try {
        if (!ep_turn(stopping)) break;
      } catch (const CommunicatorError& e) {
        // A peer rank is gone: no step can run again. Fail what is here and whatever comes later.
        m.ep_failed = e.what();
        std::fprintf(stderr, "kvfleet: %s\n", e.what());
        fail_all(m.ep_failed);
      }
      continue;
    }
    if (config_.ep) {  // a broken group: nothing can run
      fail_all(m.ep_failed);
      std::lock_guard lock(m.stats_mu);
      m.stats.scheduler = sched.stats();
      continue;
    }
    if (!sched.has_unfinished()) {
      std::lock_guard lock(m.stats_mu);  // aborts and tasks changed the numbers without a step
      m.stats.scheduler = sched.stats();
      continue;
    }
    try {
      step();
    } catch (const std::exception& e) {
      // Nothing says which request broke the step: fail them all rather than the process.
      fail_all(std::string("engine step failed: ") + e.what());
    }
  }
  // Shutting down: every request still here ends as aborted.
  for (auto& [seq, a] : m.active) emit_final(a, FinishReason::aborted, {}, "the engine is shutting down");
  m.flush_outputs();
  std::vector<KvTask> tasks;
  {
    std::lock_guard lock(m.mu);
    tasks.swap(m.kv_tasks);
  }
  for (auto& task : tasks) task(sched, *m.backend);
}

void Engine::admit(Submission& s) {
  Impl& m = *impl_;
  Active a;
  a.id = s.id;
  a.request = std::move(s.request);
  a.callback = std::move(s.callback);
  a.submitted = s.at;
  a.delivered = &m.delivered;
  try {
    SequenceParams p;
    p.prompt = a.request.prompt;
    p.priority = a.request.priority;
    p.id = s.id;  // one id: the scheduler keys the sequence by the request's id
    p.sampling_id = s.id;
    if (!a.request.cache_salt.empty()) p.hash_root = block_hash_root(config_.served_model_name, a.request.cache_salt);
    StopRules rules;
    if (!a.request.ignore_eos) rules.eos_ids = model_.config().eos_token_ids;
    rules.stop_token_ids = a.request.stop_token_ids;
    rules.stop_strings = a.request.stop;
    rules.max_tokens = a.request.max_tokens;
    // A sequence can never outgrow the whole cache (it would be preempted forever): treat the cache's
    // capacity as a context limit too.
    rules.max_model_len = std::min<std::int64_t>(max_model_len_, std::int64_t{config_.num_blocks} * config_.block_size);
    a.stops = StopChecker(std::move(rules), m.tokenizer, a.request.detokenize, a.request.skip_special_tokens);
    m.scheduler->add(std::move(p));
    m.active.emplace(s.id, std::move(a));
  } catch (const std::exception& e) {
    count_finished(FinishReason::aborted);
    emit_final(a, FinishReason::aborted, {}, e.what());
  }
}

TokenId Engine::sample_row(Active& a, const Sequence& seq, std::span<float> row, SamplerScratch& scratch) const {
  const auto vocab = row.size();
  const Tokenizer* tok = impl_->tokenizer;
  mask_unshowable(row, tok ? std::min(vocab, tok->vocab_size()) : vocab);
  if (!all_finite_or_masked(row)) throw std::runtime_error("the model produced NaN or infinite logits");
  const bool logprobs = a.request.logprobs >= 0;
  if (logprobs) {  // from the raw logits, before bias and penalties change them
    a.pending_log_z = log_normalizer(row);
    top_alternatives(row, a.request.logprobs, a.pending_log_z, scratch, a.pending_lp.top);
    a.raw_logits.clear();
  }
  for (const auto& [t, bias] : a.request.logit_bias) {
    if (logprobs) a.raw_logits.emplace_back(t, row[static_cast<std::size_t>(t)]);
    row[static_cast<std::size_t>(t)] += bias;
  }
  if (a.request.penalties.active()) {
    a.penalty_state.observe(seq.prompt(), seq.outputs());
    if (logprobs)
      for (TokenId t : a.penalty_state.ids())
        if (t >= 0 && static_cast<std::size_t>(t) < vocab) a.raw_logits.emplace_back(t, row[static_cast<std::size_t>(t)]);
    a.penalty_state.apply(row, a.request.penalties);
  }
  const TokenId chosen = sample(row, a.request.sampling, static_cast<std::uint64_t>(seq.num_output_tokens()), scratch);
  if (logprobs) {
    float raw = row[static_cast<std::size_t>(chosen)];
    for (const auto& [t, l] : a.raw_logits)  // the first entry of an id holds its raw value
      if (t == chosen) {
        raw = l;
        break;
      }
    a.pending_lp.logprob = static_cast<float>(raw - a.pending_log_z);
  }
  return chosen;
}

// Expert parallelism: every rank votes (has work, stopping) each turn; all stop together, idle together, or
// step together, a rank without work running an empty forward so that the MoE layers' exchanges line up.
bool Engine::ep_turn(bool stopping) {
  Impl& m = *impl_;
  const int n = config_.ep->size();
  bool leave = false;
  {
    std::lock_guard lock(m.mu);
    leave = m.leave;
  }
  const std::int32_t mine[3] = {m.scheduler->has_unfinished() ? 1 : 0, stopping ? 1 : 0, leave ? 1 : 0};
  std::vector<std::int32_t> all(static_cast<std::size_t>(3 * n));
  config_.ep->all_gather(mine, sizeof mine, all.data());
  bool any_work = false, all_leave = true;
  for (int r = 0; r < n; ++r) {
    if (all[static_cast<std::size_t>(3 * r + 1)]) return false;
    any_work = any_work || all[static_cast<std::size_t>(3 * r)];
    all_leave = all_leave && all[static_cast<std::size_t>(3 * r + 2)];
  }
  if (all_leave && !any_work) return false;
  m.group_idle = !any_work;
  if (mine[0]) {
    step();
  } else if (any_work) {
    m.runner->forward(ForwardBatch{});  // this rank's experts still serve the others' tokens
    std::lock_guard lock(m.stats_mu);
    count_experts();
  } else {
    std::lock_guard lock(m.stats_mu);  // aborts may have changed the numbers without a step
    m.stats.scheduler = m.scheduler->stats();
  }
  return true;
}

// Samples every job's row, in parallel from 16 rows on; a row that cannot be sampled keeps its placeholder
// token 0 and is listed in `failed` (in job order), to be failed right after the scheduler's update.
void Engine::sample_rows(std::vector<SampleJob>& jobs, std::span<float> logits, std::size_t vocab,
                         std::vector<TokenId>& sampled, std::vector<std::pair<SeqId, std::string>>& failed) {
  Impl& m = *impl_;
  std::vector<std::string>& errors = m.errors;
  errors.assign(jobs.size(), std::string());
  const auto n = static_cast<std::int64_t>(jobs.size());
  auto run = [&](std::int64_t begin, std::int64_t end, SamplerScratch& scratch) {
    for (std::int64_t i = begin; i < end; ++i) {
      SampleJob& j = jobs[static_cast<std::size_t>(i)];
      // The next row of this share, prefetched while this one is weighed (the logits are megabytes).
      scratch.next_row = i + 1 < end ? logits.data() + jobs[static_cast<std::size_t>(i + 1)].row * vocab : nullptr;
      try {
        sampled[j.slot] = sample_row(*j.active, *j.seq, std::span<float>(logits.data() + j.row * vocab, vocab), scratch);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
        if (errors[static_cast<std::size_t>(i)].empty()) errors[static_cast<std::size_t>(i)] = "sampling failed";
      }
    }
  };
  if (!m.sample_pool) m.sample_pool = std::make_unique<ThreadPool>(config_.backend.threads);
  const std::int64_t shares = n >= 16 ? m.sample_pool->size() : 1;
  m.sampler_scratch.resize(static_cast<std::size_t>(shares));
  if (shares == 1) {
    run(0, n, m.sampler_scratch[0]);
  } else {
    // Rows are claimed 16 at a time from a shared counter, not split in halves up front: a share whose
    // thread is held up (another process on its core) leaves its rows to the others. A row's token
    // depends on its row and seed alone, not on which share samples it.
    constexpr std::int64_t kClaim = 16;
    std::atomic<std::int64_t> next{0};
    m.sample_pool->parallel_for(shares, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t s = begin; s < end; ++s)
        for (std::int64_t at = next.fetch_add(kClaim); at < n; at = next.fetch_add(kClaim)) {
          if (config_.on_rows_claimed) config_.on_rows_claimed(s, at, std::min(n, at + kClaim));
          run(at, std::min(n, at + kClaim), m.sampler_scratch[static_cast<std::size_t>(s)]);
        }
    });
  }
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (!errors[i].empty()) failed.emplace_back(jobs[i].id, std::move(errors[i]));
}

void Engine::step() {
  Impl& m = *impl_;
  Scheduler& sched = *m.scheduler;
  const auto t_start = Clock::now();
  sched.schedule(m.scheduled);
  const SchedulerOutput& out = m.scheduled;
  if (out.empty()) {  // nothing fits this instant; submit() rejects what could never fit
    if (config_.ep) {  // still this rank's turn in the group's step
      m.runner->forward(ForwardBatch{});
      std::lock_guard lock(m.stats_mu);
      count_experts();
    }
    m.flush_outputs();  // this turn's aborts must not wait for the pause
    std::unique_lock lock(m.mu);
    m.wake.wait_for(lock, std::chrono::milliseconds(1));
    return;
  }
  std::span<float> logits;
  const auto t_forward = Clock::now();
  try {
    out.to_forward_batch(m.batch);
    logits = m.runner->forward_view(m.batch);
  } catch (const CommunicatorError&) {
    throw;  // the group is broken: the loop fails everything
  } catch (const std::exception& e) {
    // A step that cannot run fails the requests in it, not the engine. Under expert parallelism the
    // runner rejects a bad batch before its first exchange, so an empty step keeps the group in line.
    for (const ScheduledChunk& c : out.chunks) fail(c.id, e.what());
    if (config_.ep) m.runner->forward(ForwardBatch{});
    return;
  }
  const double forward_s = std::chrono::duration<double>(Clock::now() - t_forward).count();
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  std::vector<TokenId>& sampled = m.sampled;
  std::vector<std::pair<SeqId, std::string>>& failed = m.failed;  // rows that could not be sampled
  std::vector<SampleJob>& jobs = m.jobs;
  sampled.clear();
  failed.clear();
  jobs.clear();
  std::uint64_t prompt_tokens = 0;
  std::size_t row = 0, prefill_only = 0;
  for (const ScheduledChunk& c : out.chunks) {
    Active& a = m.active.at(c.id);
    if (!a.admitted) {
      a.admitted = true;
      a.cached_tokens = c.start_pos;
      a.queue_time_s = std::chrono::duration<double>(Clock::now() - a.submitted).count();
    }
    const Sequence* seq = sched.get(c.id);
    const auto end = c.start_pos + static_cast<std::int32_t>(c.tokens.size());
    prompt_tokens += static_cast<std::uint64_t>(std::max(0, std::min(end, seq->num_prompt_tokens) - c.start_pos));
    if (!c.sample) continue;
    if (a.request.prefill_only) {  // no token: the prompt's K/V is the product
      ++row;
      ++prefill_only;
      sampled.push_back(0);
      continue;
    }
    jobs.push_back({&a, seq, c.id, row++, sampled.size()});
    sampled.push_back(0);
  }
  sample_rows(jobs, logits, vocab, sampled, failed);
  sched.update(out, sampled);
  {
    // Counted before any callback runs: a client that has its last token must find it in the metrics.
    std::lock_guard lock(m.stats_mu);
    m.stats.prompt_tokens += prompt_tokens;
    m.stats.generated_tokens += sampled.size() - failed.size() - prefill_only;
    m.stats.steps += 1;
    count_experts();
  }
  for (const auto& [id, why] : failed) fail(id, why);
  std::size_t i = 0;
  for (const ScheduledChunk& c : out.chunks) {
    if (!c.sample) continue;
    const TokenId token = sampled[i++];
    if (auto it = m.active.find(c.id); it != m.active.end() && it->second.request.prefill_only) {
      finish_prefill_only(c.id, *sched.get(c.id));
    } else if (it != m.active.end()) {
      try {
        emit_token(c.id, token);
      } catch (const std::exception& e) {
        fail(c.id, e.what());
      }
    }
  }
  m.flush_outputs();  // inside the step's time: the hand-over to the consumer is the engine's work too
  std::lock_guard lock(m.stats_mu);
  m.stats.scheduler = sched.stats();
  m.stats.forward_seconds += forward_s;
  m.stats.step_seconds += std::chrono::duration<double>(Clock::now() - t_start).count();
}

// The step's tokens per expert (this rank's experts under expert parallelism). Caller holds stats_mu.
void Engine::count_experts() {
  const std::int64_t e = model_.config().moe.num_experts;
  const std::int64_t held = config_.ep ? e / config_.ep->size() : e;
  impl_->stats.moe.add_step(impl_->runner->expert_tokens(), e, config_.ep ? config_.ep->rank() * held : 0, held);
}

void Engine::emit_token(SeqId id, TokenId token) {
  Impl& m = *impl_;
  const Sequence* seq = m.scheduler->get(id);
  auto it = m.active.find(id);
  Active& a = it->second;
  StopResult r = a.stops.check(token, seq->num_output_tokens(), seq->num_tokens());
  RequestOutput& o = a.out;  // every field set again: its buffers are reused
  o.id = a.id;
  o.new_tokens.assign(1, token);
  o.text.swap(r.text);
  o.finished = r.reason != FinishReason::none;
  if (o.finished) o.text += a.stops.flush();
  o.finish_reason = r.reason;
  o.stop_string.swap(r.stop_string);
  o.num_prompt_tokens = seq->num_prompt_tokens;
  o.num_cached_tokens = a.cached_tokens;
  o.error.clear();
  o.queue_time_s = a.queue_time_s;
  o.pin = 0;
  if (a.request.logprobs >= 0) {
    o.logprobs.resize(1);
    o.logprobs[0].logprob = a.pending_lp.logprob;
    o.logprobs[0].top.swap(a.pending_lp.top);  // the old list's memory goes back for the next token
  } else {
    o.logprobs.clear();
  }
  // Counted before it is delivered: whoever sees the final output (a rank's callback sends it at once) and
  // then asks for stats (answered off the engine thread) must find it counted.
  if (o.finished) count_finished(o.finish_reason);
  deliver(a, o);
  if (o.finished) {
    m.scheduler->finish(id, o.finish_reason);
    m.active.erase(it);
  }
}

// A prefill_only request reached the end of its prompt: pin its full blocks, hand the pin over, finish.
void Engine::finish_prefill_only(SeqId id, const Sequence& seq) {
  Impl& m = *impl_;
  Active& a = m.active.at(id);
  const auto full = static_cast<std::size_t>(seq.num_prompt_tokens / config_.block_size);
  RequestOutput o;
  o.id = a.id;
  o.finished = true;
  o.finish_reason = FinishReason::length;
  o.num_prompt_tokens = seq.num_prompt_tokens;
  o.num_cached_tokens = a.cached_tokens;
  o.queue_time_s = a.queue_time_s;
  o.pin = m.scheduler->kv().pin(std::span<const BlockId>(seq.block_table).first(full));
  count_finished(FinishReason::length);  // before it is delivered, as in emit_token
  deliver(a, o);
  m.scheduler->finish(id, FinishReason::length);
  m.active.erase(id);
}

void Engine::fail(SeqId seq, const std::string& error) {
  Impl& m = *impl_;
  auto it = m.active.find(seq);
  if (it == m.active.end()) return;
  try {
    m.scheduler->abort(seq);
  } catch (const std::exception&) {
    // The request ends either way; the scheduler's own check_integrity would tell what went wrong.
  }
  count_finished(FinishReason::aborted);
  emit_final(it->second, FinishReason::aborted, {}, error);
  m.active.erase(it);
}

void Engine::fail_all(const std::string& error) {
  std::vector<SeqId> seqs;
  for (const auto& [seq, a] : impl_->active) seqs.push_back(seq);
  for (SeqId seq : seqs) fail(seq, error);
}

void Engine::count_finished(FinishReason reason) {
  std::lock_guard lock(impl_->stats_mu);
  impl_->stats.finished[static_cast<std::size_t>(reason)] += 1;
}

}  // namespace kvfleet
