// Speculative decoding's part of an engine step (engine/spec/proposer.h has the contract):
//   begin_spec_step     whether this step may speculate (fewer running sequences than disable_by_batch_size)
//   propose_drafts      the scheduler's draft source: per decode, the proposer's drafts, capped so that the
//                       accepted tokens can never pass max_tokens or the context
//   verify_drafts       each speculating chunk's rows left to right (engine/spec/verify.h; drafts drawn from a
//                       draft model's q: verify_sampled_drafts, engine/spec/draft_probs.h), then its stop checks:
//                       tokens after a stop are dropped before the scheduler sees them
//   update_with_drafts  Scheduler::update with 1 to d + 1 tokens per speculating chunk
//   emit_speculated     one output with all of a chunk's kept tokens
#include <algorithm>
#include <stdexcept>

#include "engine/runtime/engine_impl.h"
#include "engine/spec/draft_model.h"
#include "engine/spec/draft_probs.h"
#include "engine/spec/verify.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet {

void Engine::set_up_speculation() {
  Impl& m = *impl_;
  if (!config_.speculative.enabled()) return;
  validate(config_.speculative);
  // The group's ranks would each speculate on their own; their stats and the lockstep are not set up for it.
  if (config_.ep)
    throw std::invalid_argument("speculative_config: speculative decoding is not supported with expert parallelism (ep_size > 1)");
  if (config_.speculative.method == "draft_model") {
    spec::DraftModelOptions o;
    o.backend = config_.backend;
    o.num_blocks = config_.num_blocks;
    o.block_size = config_.block_size;
    o.max_batch_tokens = config_.scheduler.max_num_batched_tokens;
    o.target_vocab = model_.config().vocab_size;
    m.proposer = std::make_unique<spec::DraftModelProposer>(config_.speculative, o);
  } else {
    m.proposer = spec::make_proposer(config_.speculative);
  }
  m.stats.spec.method = config_.speculative.method;
  m.stats.spec.accepted_per_pos.assign(static_cast<std::size_t>(config_.speculative.num_speculative_tokens), 0);
  m.scheduler->set_draft_source(
      [this](const Sequence& seq, std::int32_t max_drafts, std::vector<TokenId>& out) { propose_drafts(seq, max_drafts, out); });
}

void Engine::begin_spec_step() {
  Impl& m = *impl_;
  m.spec_step = m.proposer && static_cast<std::int32_t>(m.scheduler->running().size()) < config_.speculative.disable_by_batch_size;
}

void Engine::propose_drafts(const Sequence& seq, std::int32_t max_drafts, std::vector<TokenId>& out) {
  Impl& m = *impl_;
  out.clear();
  if (!m.spec_step) return;
  const auto it = m.active.find(seq.id);
  // A constrained request does not speculate: its mask for a verify row would need the matcher advanced
  // through the drafts before them.
  if (it == m.active.end() || it->second.request.prefill_only || it->second.matcher) return;
  Active& a = it->second;
  // Room for the drafts and the target's own token within max_tokens and the context (the cache's too).
  const std::int64_t limit = std::min<std::int64_t>(max_model_len_, std::int64_t{config_.num_blocks} * config_.block_size);
  const std::int64_t room = std::min<std::int64_t>(a.request.max_tokens - seq.num_output_tokens(), limit - seq.num_tokens());
  const auto k = static_cast<std::int32_t>(
      std::min<std::int64_t>({config_.speculative.num_speculative_tokens, max_drafts, room - 1}));
  if (k <= 0 || !a.spec.may_propose()) return;
  if (config_.propose_for_test) {
    config_.propose_for_test(seq, k, out);
  } else {
    m.proposer->propose(spec::ProposeInput{seq.id, a.request.cache_salt, seq.tokens, seq.num_prompt_tokens,
                                           &a.request.sampling, a.request.logit_bias,
                                           m.tokenizer ? m.tokenizer->vocab_size() : 0},
                        k, out);
  }
  if (static_cast<std::int32_t>(out.size()) > k) out.resize(static_cast<std::size_t>(k));
}

// The request ends: a proposer with per-request state (suffix decoding) drops it, and may keep its outputs.
void Engine::end_speculation(SeqId id, const Active& a) {
  Impl& m = *impl_;
  if (!m.proposer || a.request.prefill_only) return;
  const Sequence* seq = m.scheduler->get(id);
  if (!seq) return;
  m.proposer->finish(spec::ProposeInput{id, a.request.cache_salt, seq->tokens, seq->num_prompt_tokens, nullptr, {}, 0});
}

void Engine::verify_drafts(std::span<float> logits, std::size_t vocab) {
  Impl& m = *impl_;
  if (m.sampler_scratch.empty()) m.sampler_scratch.resize(1);
  SamplerScratch& scratch = m.sampler_scratch[0];
  std::vector<TokenId> emitted;
  SpecDecodeStats counts;
  counts.accepted_per_pos.assign(static_cast<std::size_t>(config_.speculative.num_speculative_tokens), 0);
  for (SpecJob& j : m.spec_jobs) {
    Active& a = *j.active;
    const Sequence& seq = *j.seq;
    const std::span<const TokenId> drafts(seq.verify_tokens.data() + 1, seq.verify_tokens.size() - 1);
    // Row r is sampled as the sequence extended by the drafts before it (penalties, the draw's position).
    Sequence& ctx = m.spec_seq;
    ctx.tokens.assign(seq.tokens.begin(), seq.tokens.end());
    ctx.num_prompt_tokens = seq.num_prompt_tokens;
    emitted.clear();
    j.logprobs.clear();
    std::int32_t accepted = 0;
    // Drafts drawn from a distribution q (a draft model, sampled request): min(1, p/q); else the point-mass rule.
    const std::span<const float> q = config_.propose_for_test ? std::span<const float>() : m.proposer->draft_probs(j.id, drafts);
    try {
      if (!q.empty()) {
        accepted = verify_sampled_drafts(j, drafts, q, logits, vocab, emitted);
      } else {
        accepted = spec::accept_drafts(drafts, [&](std::size_t r) {
          if (r > 0) ctx.tokens.push_back(drafts[r - 1]);
          const TokenId x = sample_row(a, ctx, std::span<float>(logits.data() + (j.row + r) * vocab, vocab), scratch);
          if (a.request.logprobs >= 0) j.logprobs.push_back(a.pending_lp);
          return x;
        }, emitted);
      }
    } catch (const std::exception& e) {
      j.failed = true;
      m.failed.emplace_back(j.id, e.what()[0] ? e.what() : "sampling failed");
      j.tokens.assign(1, 0);
      continue;
    }
    counts.num_drafts += 1;
    counts.num_draft_tokens += drafts.size();
    counts.num_accepted_tokens += static_cast<std::uint64_t>(accepted);
    for (std::int32_t p = 0; p < accepted; ++p) counts.accepted_per_pos[static_cast<std::size_t>(p)] += 1;
    a.spec.record(static_cast<std::int32_t>(drafts.size()), accepted);
    // Stop checks token by token, before the scheduler sees them: what follows a stop is never appended.
    j.tokens.clear();
    j.text.clear();
    for (std::size_t t = 0; t < emitted.size(); ++t) {
      const auto n = static_cast<std::int32_t>(t + 1);
      StopResult r = a.stops.check(emitted[t], seq.num_output_tokens() + n, seq.num_tokens() + n);
      j.tokens.push_back(emitted[t]);
      j.text += r.text;
      if (r.reason != FinishReason::none) {
        j.reason = r.reason;
        j.stop_string = std::move(r.stop_string);
        break;
      }
    }
    if (j.logprobs.size() > j.tokens.size()) j.logprobs.resize(j.tokens.size());
    m.spec_extra_tokens += j.tokens.size() - 1;
  }
  std::lock_guard lock(m.stats_mu);
  SpecDecodeStats& s = m.stats.spec;
  s.num_drafts += counts.num_drafts;
  s.num_draft_tokens += counts.num_draft_tokens;
  s.num_accepted_tokens += counts.num_accepted_tokens;
  for (std::size_t p = 0; p < counts.accepted_per_pos.size(); ++p) s.accepted_per_pos[p] += counts.accepted_per_pos[p];
}

// The rows of drafts drawn from q (engine/spec/draft_probs.h): row r's distribution p is the sampler's (the
// sequence extended by the drafts before it); draft r is kept with probability min(1, p/q), else the row emits
// a token of the residual max(0, p - q) renormalised and the step ends; all kept, the last row's token is
// sampled as usual. Appends the emitted tokens; returns the number of kept drafts.
std::int32_t Engine::verify_sampled_drafts(SpecJob& j, std::span<const TokenId> drafts, std::span<const float> q,
                                           std::span<float> logits, std::size_t vocab, std::vector<TokenId>& emitted) {
  Impl& m = *impl_;
  Active& a = *j.active;
  SamplerScratch& scratch = m.sampler_scratch[0];
  Sequence& ctx = m.spec_seq;
  const std::uint64_t seed = a.request.sampling.seed;
  for (std::size_t r = 0;; ++r) {
    if (r > 0) ctx.tokens.push_back(drafts[r - 1]);
    const std::span<float> row(logits.data() + (j.row + r) * vocab, vocab);
    if (r == drafts.size()) {
      emitted.push_back(sample_row(a, ctx, row, scratch));
      if (a.request.logprobs >= 0) j.logprobs.push_back(a.pending_lp);
      return static_cast<std::int32_t>(r);
    }
    prepare_row(a, ctx, row, scratch);
    spec::sampling_probs(row, a.request.sampling, m.spec_p);
    const auto position = static_cast<std::uint64_t>(ctx.num_output_tokens());
    const spec::Verdict v = spec::accept_or_resample(m.spec_p, q.subspan(r * vocab, vocab), drafts[r],
                                                     spec::accept_draw(seed, position),
                                                     spec::residual_draw(seed, position), m.spec_residual);
    chose_row(a, row, v.token);
    emitted.push_back(v.token);
    if (a.request.logprobs >= 0) j.logprobs.push_back(a.pending_lp);
    if (!v.accepted) return static_cast<std::int32_t>(r);
  }
}

// Scheduler::update with every sampling chunk's tokens in chunk order: one for a plain chunk (from the step's
// sampled tokens), the kept tokens of a speculating one.
void Engine::update_with_drafts() {
  Impl& m = *impl_;
  m.step_tokens.clear();
  m.step_counts.clear();
  std::size_t i = 0, speculated = 0;
  for (const ScheduledChunk& c : m.scheduled.chunks) {
    if (!c.sample) continue;
    const TokenId token = m.sampled[i++];
    if (c.num_drafts == 0) {
      m.step_tokens.push_back(token);
      m.step_counts.push_back(1);
      continue;
    }
    const SpecJob& j = m.spec_jobs[speculated++];
    m.step_tokens.insert(m.step_tokens.end(), j.tokens.begin(), j.tokens.end());
    m.step_counts.push_back(static_cast<std::int32_t>(j.tokens.size()));
  }
  m.scheduler->update(m.scheduled, m.step_tokens, m.step_counts);
}

void Engine::emit_speculated(const ScheduledChunk& c, std::size_t job) {
  Impl& m = *impl_;
  SpecJob& j = m.spec_jobs[job];
  if (j.failed) return;
  const Sequence* seq = m.scheduler->get(c.id);
  auto it = m.active.find(c.id);
  Active& a = it->second;
  RequestOutput& o = a.out;
  o.id = a.id;
  o.new_tokens = j.tokens;
  o.text.swap(j.text);
  o.finished = j.reason != FinishReason::none;
  if (o.finished) o.text += a.stops.flush();
  o.finish_reason = j.reason;
  o.stop_string.swap(j.stop_string);
  o.num_prompt_tokens = seq->num_prompt_tokens;
  o.num_cached_tokens = a.cached_tokens;
  o.error.clear();
  o.queue_time_s = a.queue_time_s;
  o.pin = 0;
  o.kv_tier_loads = std::move(a.tier_loads);  // the first output's; empty after it
  a.tier_loads.clear();
  o.logprobs.swap(j.logprobs);
  if (a.request.logprobs < 0) o.logprobs.clear();
  if (o.finished) count_finished(o.finish_reason);
  deliver(a, o);
  if (o.finished) {
    end_speculation(c.id, a);
    m.scheduler->finish(c.id, o.finish_reason);
    m.active.erase(it);
  }
}

}  // namespace kvfleet
