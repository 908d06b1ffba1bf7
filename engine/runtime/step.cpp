// One engine step: schedule -> forward -> sample -> update -> outputs, and what a request's end does.
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/runtime/engine_impl.h"
#include "kvfleet/communicator.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet {

namespace {

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

// Callbacks run on the engine thread; one that throws must not take the engine (or other requests) down.
void deliver(Engine::Active& a, const RequestOutput& out) noexcept {
  if (a.delivered) *a.delivered = true;
  try {
    if (a.callback) a.callback(out);
  } catch (...) {
  }
}

void emit_final(Engine::Active& a, FinishReason reason, std::string stop_string, std::string error) {
  RequestOutput out;
  out.id = a.id;
  out.finished = true;
  out.finish_reason = reason;
  out.stop_string = std::move(stop_string);
  out.text = a.stops.flush();
  out.num_prompt_tokens = a.num_prompt_tokens;
  out.num_cached_tokens = a.cached_tokens;
  out.error = std::move(error);
  out.queue_time_s = a.queue_time_s;
  out.resumed_text = std::move(a.resumed_text);
  a.resumed_text.clear();
  out.kv_tier_loads = std::move(a.tier_loads);
  a.tier_loads.clear();
  deliver(a, out);
}

TokenId Engine::sample_row(Active& a, const Sequence& seq, std::span<float> row, SamplerScratch& scratch) const {
  prepare_row(a, seq, row, scratch);
  const TokenId chosen = sample(row, a.request.sampling, static_cast<std::uint64_t>(seq.num_output_tokens()), scratch);
  if (a.matcher && !bitmask_allows(a.mask, chosen))  // sample() never draws a -inf logit: this cannot happen
    throw std::runtime_error("constrained decoding: the sampler chose token " + std::to_string(chosen) +
                             ", which the grammar does not allow");
  chose_row(a, row, chosen);
  return chosen;
}

// The row as the sampler draws from it: unshowable ids and the grammar's mask, logit bias, penalties; with
// logprobs, the raw logits' normaliser and alternatives first.
void Engine::prepare_row(Active& a, const Sequence& seq, std::span<float> row, SamplerScratch& scratch) const {
  const auto vocab = row.size();
  const Tokenizer* tok = impl_->tokenizer;
  mask_unshowable(row, tok ? std::min(vocab, tok->vocab_size()) : vocab);
  if (!all_finite_or_masked(row)) throw std::runtime_error("the model produced NaN or infinite logits");
  // The grammar's mask first: logprobs are then those of the allowed tokens (vLLM's: the mask is applied to
  // the model's logits before its sampler computes them), and -inf stays -inf through bias and penalties.
  if (a.matcher) {
    if (!a.mask_error.empty()) throw std::runtime_error(a.mask_error);
    if (!apply_token_mask(row, a.mask))
      throw std::runtime_error("constrained decoding: the grammar allows no token this model can produce here");
  }
  const bool logprobs = a.request.logprobs >= 0;
  if (logprobs) {  // from the raw logits, before bias and penalties change them
    a.pending_log_z = log_normalizer(row);
    top_alternatives(row, a.request.logprobs, a.pending_log_z, scratch, a.pending_lp.top);
    if (a.matcher)  // fewer allowed tokens than asked for: a token that cannot be sampled is no alternative
      std::erase_if(a.pending_lp.top, [](const TokenLogprob& t) { return !std::isfinite(t.logprob); });
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
}

// With logprobs: the chosen token's, from its raw logit.
void Engine::chose_row(Active& a, std::span<const float> row, TokenId chosen) const {
  if (a.request.logprobs >= 0) {
    float raw = row[static_cast<std::size_t>(chosen)];
    for (const auto& [t, l] : a.raw_logits)  // the first entry of an id holds its raw value
      if (t == chosen) {
        raw = l;
        break;
      }
    a.pending_lp.logprob = static_cast<float>(raw - a.pending_log_z);
  }
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
  if (!m.sample_pool) {
    m.sample_pool = m.backend->host_threads();
    if (!m.sample_pool) m.sample_pool = (m.own_sample_pool = std::make_unique<ThreadPool>(config_.backend.threads)).get();
  }
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
  const auto t_start = EngineClock::now();
  begin_spec_step();
  if (m.tiers) m.tiers->before_schedule();  // lower KV tiers land the next admissions' prefixes
  m.scheduler->schedule(m.scheduled);
  if (m.scheduled.empty()) return pause_empty_step();  // nothing fits this instant
  start_masks();  // constrained rows: their masks are computed while the forward runs
  std::span<float> logits;
  const auto t_forward = EngineClock::now();
  if (!forward_scheduled(logits)) return;
  const double forward_s = std::chrono::duration<double>(EngineClock::now() - t_forward).count();
  std::uint64_t prompt_tokens = 0;
  std::size_t prefill_only = 0;
  collect_sample_jobs(prompt_tokens, prefill_only);
  sample_rows(m.jobs, logits, static_cast<std::size_t>(model_.config().vocab_size), m.sampled, m.failed);
  if (m.spec_jobs.empty()) {
    m.scheduler->update(m.scheduled, m.sampled);
  } else {
    verify_drafts(logits, static_cast<std::size_t>(model_.config().vocab_size));
    update_with_drafts();
  }
  {
    // Counted before any callback runs: a client that has its last token must find it in the metrics.
    std::lock_guard lock(m.stats_mu);
    m.stats.prompt_tokens += prompt_tokens;
    m.stats.generated_tokens += m.sampled.size() - m.failed.size() - prefill_only + m.spec_extra_tokens;
    m.stats.steps += 1;
    count_experts();
  }
  emit_step_outputs();
  m.flush_outputs();  // inside the step's time: the hand-over to the consumer is the engine's work too
  std::lock_guard lock(m.stats_mu);
  m.stats.scheduler = m.scheduler->stats();
  if (m.tiers) m.stats.kv_tiers = m.tiers->stats();
  m.stats.forward_seconds += forward_s;
  m.stats.step_seconds += std::chrono::duration<double>(EngineClock::now() - t_start).count();
}

// Nothing fits this instant (submit() rejects what could never fit): a group's step still needs this rank's
// empty forward; then a short pause, this turn's aborts delivered first.
void Engine::pause_empty_step() {
  Impl& m = *impl_;
  if (m.lockstep->forward_when_idle()) serve_peers();
  m.flush_outputs();
  std::unique_lock lock(m.mu);
  m.wake.wait_for(lock, std::chrono::milliseconds(1));
}

// The scheduled chunks' forward pass; the logits of the rows that sample. False: the step could not run and
// its requests failed (not the engine).
bool Engine::forward_scheduled(std::span<float>& logits) {
  Impl& m = *impl_;
  // Every way out waits for the mask worker first: it uses the matchers of requests that may fail here.
  try {
    m.scheduled.to_forward_batch(m.batch);
    logits = m.runner->forward_view(m.batch);
    m.masks.wait();
    return true;
  } catch (const CommunicatorError&) {
    m.masks.wait();
    throw;  // the group is broken: the loop fails everything
  } catch (const std::exception& e) {
    m.masks.wait();
    // Under expert parallelism the runner rejects a bad batch before its first exchange, so an empty step
    // keeps the group in line.
    for (const ScheduledChunk& c : m.scheduled.chunks) fail(c.id, e.what());
    if (m.lockstep->forward_when_idle()) m.runner->forward(ForwardBatch{});
    return false;
  }
}

// The step's constrained rows (chunks that sample, of requests with a grammar): the mask worker fills their
// masks from their matchers, which accepted every output token so far (emit_token, one step earlier).
void Engine::start_masks() {
  Impl& m = *impl_;
  m.mask_jobs.clear();
  for (const ScheduledChunk& c : m.scheduled.chunks) {
    if (!c.sample) continue;
    Active& a = m.active.at(c.id);
    if (!a.matcher) continue;
    a.mask_error.clear();
    if (a.accepted != m.scheduler->get(c.id)->num_output_tokens()) {
      a.mask_error = "constrained decoding: the grammar is out of step with the output";
      continue;
    }
    m.mask_jobs.push_back({a.matcher.get(), &a.mask, &a.mask_error});
  }
  m.masks.start(m.mask_jobs);
}

// One sampling job per chunk that samples (a prefill_only request's row gets none: its K/V is the product);
// admission's figures (cached tokens, queue time) on a request's first chunk; the prompt tokens computed.
void Engine::collect_sample_jobs(std::uint64_t& prompt_tokens, std::size_t& prefill_only) {
  Impl& m = *impl_;
  m.sampled.clear();
  m.failed.clear();
  m.jobs.clear();
  m.spec_jobs.clear();
  m.spec_extra_tokens = 0;
  std::size_t row = 0;
  for (const ScheduledChunk& c : m.scheduled.chunks) {
    Active& a = m.active.at(c.id);
    if (!a.admitted) {
      a.admitted = true;
      a.cached_tokens = c.start_pos;
      a.queue_time_s = std::chrono::duration<double>(EngineClock::now() - a.submitted).count();
      a.tier_loads = m.scheduler->get(c.id)->tier_loads;
    }
    const Sequence* seq = m.scheduler->get(c.id);
    const auto end = c.start_pos + static_cast<std::int32_t>(c.tokens.size());
    prompt_tokens += static_cast<std::uint64_t>(std::max(0, std::min(end, seq->num_prompt_tokens) - c.start_pos));
    if (!c.sample) continue;
    if (c.num_drafts > 0) {  // speculating: rows row .. row + num_drafts, verified in verify_drafts
      SpecJob& job = m.spec_jobs.emplace_back();
      job.active = &a;
      job.seq = seq;
      job.id = c.id;
      job.row = row;
      row += 1 + static_cast<std::size_t>(c.num_drafts);
    } else if (a.request.prefill_only) {
      ++row;
      ++prefill_only;
    } else {
      m.jobs.push_back({&a, seq, c.id, row++, m.sampled.size()});
    }
    m.sampled.push_back(0);
  }
}

// After the scheduler's update: the rows that could not be sampled fail, every other sampling chunk's token
// goes through its stop checks to its callback, a prefill_only request hands its pinned blocks over.
void Engine::emit_step_outputs() {
  Impl& m = *impl_;
  for (const auto& [id, why] : m.failed) fail(id, why);
  std::size_t i = 0, speculated = 0;
  for (const ScheduledChunk& c : m.scheduled.chunks) {
    if (!c.sample) continue;
    const TokenId token = m.sampled[i++];
    auto it = m.active.find(c.id);
    if (c.num_drafts > 0) ++speculated;
    if (it == m.active.end()) continue;  // failed above
    if (c.num_drafts > 0) {
      emit_speculated(c, speculated - 1);
      continue;
    }
    if (it->second.request.prefill_only) {
      finish_prefill_only(c.id, *m.scheduler->get(c.id));
      continue;
    }
    try {
      emit_token(c.id, token);
    } catch (const std::exception& e) {
      fail(c.id, e.what());
    }
  }
}

// No work on this rank while others step: an empty forward, so that the MoE layers' exchanges line up (this
// rank's experts serve the others' tokens).
void Engine::serve_peers() {
  impl_->runner->forward(ForwardBatch{});
  std::lock_guard lock(impl_->stats_mu);
  count_experts();
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
  bool grammar_ended = false;
  if (a.matcher) {
    if (!a.matcher->accept_token(token))
      throw std::runtime_error("constrained decoding: the grammar refused token " + std::to_string(token) +
                               ", which its mask allowed");
    ++a.accepted;
    grammar_ended = a.matcher->is_terminated();
  }
  StopResult r = a.stops.check(token, seq->num_output_tokens(), seq->num_tokens(), grammar_ended);
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
  o.resumed_text = std::move(a.resumed_text);  // the first output's; empty (moved from) after it
  a.resumed_text.clear();
  o.kv_tier_loads = std::move(a.tier_loads);  // the same
  a.tier_loads.clear();
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
    end_speculation(id, a);
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
  end_speculation(seq, it->second);
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
