#include "kvfleet/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvfleet {

Scheduler::Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config) : config_(config), kv_(kv_config) {
  if (config.max_num_seqs <= 0 || config.max_num_batched_tokens <= 0) {
    throw std::invalid_argument("Scheduler: max_num_seqs and max_num_batched_tokens must be positive");
  }
  running_.reserve(static_cast<std::size_t>(config.max_num_seqs));
}

std::string why_never_schedulable(std::int64_t prompt_len, const SchedulerConfig& config, std::int64_t num_blocks,
                                  std::int32_t block_size) {
  // +1: the first sampled token must fit as well.
  if (prompt_len + 1 > num_blocks * block_size)
    return "the prompt has " + std::to_string(prompt_len) + " tokens, more than the KV cache holds";
  if (!config.enable_chunked_prefill && prompt_len > config.max_num_batched_tokens)
    return "the prompt has " + std::to_string(prompt_len) + " tokens, more than max_num_batched_tokens (" +
           std::to_string(config.max_num_batched_tokens) + ") with chunked prefill off";
  return {};
}

SeqId Scheduler::add(SequenceParams params) {
  const auto n = static_cast<std::int32_t>(params.prompt.size());
  if (n == 0) throw std::invalid_argument("Scheduler::add: empty prompt");
  // A resumed sequence computes its outputs so far with the prompt (as after a preemption).
  const auto total = n + static_cast<std::int32_t>(params.outputs.size());
  if (std::string why = why_never_schedulable(total, config_, kv_.pool().num_blocks(), kv_.block_size()); !why.empty())
    throw std::invalid_argument(std::move(why));
  if (params.id != 0 && seqs_.count(params.id) != 0)
    throw std::invalid_argument("Scheduler::add: sequence id " + std::to_string(params.id) + " is in use");
  auto seq = std::make_unique<Sequence>();
  seq->id = params.id != 0 ? params.id : next_id_++;
  seq->arrival = ++arrivals_;
  seq->priority = params.priority;
  seq->hash_root = params.hash_root;
  seq->tokens = std::move(params.prompt);
  seq->tokens.insert(seq->tokens.end(), params.outputs.begin(), params.outputs.end());
  seq->num_prompt_tokens = n;
  Sequence* raw = seq.get();
  seqs_.emplace(raw->id, std::move(seq));
  insert_waiting(raw);
  return raw->id;
}

bool Scheduler::before(const Sequence& a, const Sequence& b) const {
  if (config_.use_priority && a.priority != b.priority) return a.priority < b.priority;
  return a.arrival < b.arrival;
}

void Scheduler::insert_waiting(Sequence* seq) {
  // New arrivals belong at the back; scanning from there makes the common case O(1).
  auto it = waiting_.end();
  while (it != waiting_.begin() && before(*seq, **std::prev(it))) --it;
  waiting_.insert(it, seq);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  schedule(out);
  return out;
}

void Scheduler::schedule(SchedulerOutput& out) {
  retired_.clear();  // the previous output is consumed by now
  out.chunks.clear();
  out.preempted.clear();
  out.num_batched_tokens = 0;
  out.step = ++step_;
  out.chunks.reserve(running_.size() + 8);
  std::int32_t budget = config_.max_num_batched_tokens;

  schedule_decodes(budget, out);
  for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    std::int32_t n = seq->num_uncomputed_tokens();
    if (seq->status != SeqStatus::running || n <= 1) continue;
    if (config_.enable_chunked_prefill) {
      n = std::min(n, budget);
    } else if (n > budget) {
      continue;
    }
    schedule_running(seq, n, budget, out);
  }
  if (!out.preempted.empty()) {
    std::erase_if(running_, [](const Sequence* s) { return s->status != SeqStatus::running; });
  } else {
    admit_waiting(budget, out);  // not under memory pressure
  }

  for (ScheduledChunk& c : out.chunks) {
    const Sequence& seq = *c.seq_;
    c.tokens = c.num_drafts > 0 ? std::span<const TokenId>(seq.verify_tokens)
                                : std::span<const TokenId>(seq.tokens).subspan(static_cast<std::size_t>(c.start_pos),
                                                                               c.tokens.size());
    c.block_table = seq.block_table;
    out.num_batched_tokens += static_cast<std::int32_t>(c.tokens.size());
  }
}

// Decodes first, one token each. They never outnumber the budget, whatever max_num_seqs is: a sequence
// becomes a decode only in a step that scheduled its last prompt chunk (at least one token of that step's
// budget) or its previous decode, so every decode of a step had a token of the previous step's budget.
// Drafts take only what is left of the budget after one token per decode (`spare`), so no decode waits.
// Indexes, not iterators: preemption marks sequences but leaves running_ in place until below.
void Scheduler::schedule_decodes(std::int32_t& budget, SchedulerOutput& out) {
  auto is_decode = [](const Sequence* s) { return s->status == SeqStatus::running && s->num_uncomputed_tokens() == 1; };
  std::int32_t spare = 0;
  if (draft_source_) spare = budget - static_cast<std::int32_t>(std::count_if(running_.begin(), running_.end(), is_decode));
  for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    if (!is_decode(seq)) continue;
    if (spare > 0 && schedule_with_drafts(seq, spare, budget, out)) continue;
    schedule_running(seq, 1, budget, out);
  }
}

// A decode with the draft source's drafts, when it proposes some and their blocks are free (no eviction of a
// running sequence for a guess). False: schedule it plainly.
bool Scheduler::schedule_with_drafts(Sequence* seq, std::int32_t& spare, std::int32_t& budget, SchedulerOutput& out) {
  drafts_.clear();
  draft_source_(*seq, spare, drafts_);
  const auto d = std::min(static_cast<std::int32_t>(drafts_.size()), spare);
  if (d <= 0 || !kv_.allocate(*seq, 1 + d)) return false;
  seq->verify_tokens.assign(1, seq->tokens.back());
  seq->verify_tokens.insert(seq->verify_tokens.end(), drafts_.begin(), drafts_.begin() + d);
  push_chunk(seq, 1 + d, budget, out);
  ScheduledChunk& c = out.chunks.back();
  c.sample = true;
  c.num_drafts = d;
  spare -= d;
  return true;
}

// Records the chunk's position and size; schedule() points the spans at the sequence at the end,
// once no block table can change any more.
void Scheduler::push_chunk(Sequence* seq, std::int32_t num_tokens, std::int32_t& budget, SchedulerOutput& out) {
  ScheduledChunk c;
  c.id = seq->id;
  c.start_pos = seq->num_computed_tokens;
  c.tokens = std::span<const TokenId>(seq->tokens.data(), static_cast<std::size_t>(num_tokens));
  c.sample = c.start_pos + num_tokens == seq->num_tokens();
  c.seq_ = seq;
  out.chunks.push_back(c);
  budget -= num_tokens;
}

void Scheduler::schedule_running(Sequence* seq, std::int32_t num_tokens, std::int32_t& budget, SchedulerOutput& out) {
  while (!kv_.allocate(*seq, num_tokens)) {
    Sequence* victim = pick_victim();
    preempt(victim, budget, out);
    if (victim == seq) return;
  }
  push_chunk(seq, num_tokens, budget, out);
}

Sequence* Scheduler::pick_victim() const {
  Sequence* victim = nullptr;
  for (Sequence* s : running_) {
    if (s->status == SeqStatus::running && (victim == nullptr || before(*victim, *s))) victim = s;
  }
  return victim;
}

void Scheduler::preempt(Sequence* victim, std::int32_t& budget, SchedulerOutput& out) {
  // A victim already scheduled this step leaves the batch and gives its tokens back.
  const auto it =
      std::find_if(out.chunks.begin(), out.chunks.end(), [&](const ScheduledChunk& c) { return c.seq_ == victim; });
  if (it != out.chunks.end()) {
    budget += static_cast<std::int32_t>(it->tokens.size());
    out.chunks.erase(it);
  }
  kv_.free(*victim);
  victim->num_computed_tokens = 0;
  victim->status = SeqStatus::preempted;
  ++victim->num_preemptions;
  ++num_preemptions_;
  insert_waiting(victim);
  out.preempted.push_back(victim->id);
}

void Scheduler::admit_waiting(std::int32_t& budget, SchedulerOutput& out) {
  const auto max_seqs = static_cast<std::size_t>(config_.max_num_seqs);
  std::size_t at = 0;
  while (at < waiting_.size() && budget > 0 && running_.size() < max_seqs) {
    Sequence* seq = waiting_[at];
    if (seq->kv_loading) {  // its prefix is still coming from a lower KV tier: the ones behind it go first
      ++at;
      continue;
    }
    const std::vector<BlockId> prefix = kv_.find_cached_prefix(*seq);
    std::int32_t n = seq->num_tokens() - static_cast<std::int32_t>(prefix.size()) * kv_.block_size();
    if (config_.enable_chunked_prefill) {
      n = std::min(n, budget);
    } else if (n > budget) {
      break;
    }
    if (!kv_.allocate(*seq, n, prefix)) break;
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(at));
    seq->status = SeqStatus::running;
    running_.push_back(seq);
    push_chunk(seq, n, budget, out);
  }
}

void Scheduler::update(const SchedulerOutput& out, std::span<const TokenId> sampled) {
  update(out, sampled, {});
}

void Scheduler::update(const SchedulerOutput& out, std::span<const TokenId> sampled,
                       std::span<const std::int32_t> counts) {
  if (out.step != step_ || applied_step_ == step_) {
    throw std::logic_error("Scheduler::update: not the latest schedule() output, or applied already");
  }
  const std::size_t samples = out.num_samples();
  if (counts.empty() ? sampled.size() != samples : counts.size() != samples) {
    throw std::invalid_argument("Scheduler::update: one count (or one sampled token) per sampling chunk");
  }
  std::size_t total = 0, i = 0;
  for (const ScheduledChunk& c : out.chunks) {
    if (!c.sample || counts.empty()) continue;
    const std::int32_t n = counts[i++];
    if (n < 1 || n > 1 + c.num_drafts) throw std::invalid_argument("Scheduler::update: a count outside [1, drafts + 1]");
    total += static_cast<std::size_t>(n);
  }
  if (!counts.empty() && total != sampled.size()) throw std::invalid_argument("Scheduler::update: counts do not sum to the tokens");
  applied_step_ = step_;
  std::size_t k = 0;
  i = 0;
  for (const ScheduledChunk& c : out.chunks) {
    Sequence* seq = c.seq_;
    const std::size_t n = !c.sample ? 0 : counts.empty() ? 1 : static_cast<std::size_t>(counts[i++]);
    const std::span<const TokenId> tokens = sampled.subspan(k, n);
    k += n;
    if (seq->status != SeqStatus::running) continue;  // finished or aborted while in flight
    // A speculating chunk computed the last token and the drafts; only the accepted ones count.
    seq->num_computed_tokens += c.num_drafts > 0 ? static_cast<std::int32_t>(n) : static_cast<std::int32_t>(c.tokens.size());
    seq->tokens.insert(seq->tokens.end(), tokens.begin(), tokens.end());
    kv_.commit(*seq);
    if (c.num_drafts > 0) kv_.trim(*seq);
  }
}

bool Scheduler::finish(SeqId id, FinishReason reason) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Sequence* seq = it->second.get();
  if (seq->status == SeqStatus::running) {
    std::erase(running_, seq);
  } else {
    std::erase(waiting_, seq);
  }
  kv_.free(*seq);
  seq->status = SeqStatus::finished;
  seq->finish_reason = reason;
  retired_.push_back(std::move(it->second));
  seqs_.erase(it);
  return true;
}

const Sequence* Scheduler::get(SeqId id) const {
  const auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

std::size_t SchedulerOutput::num_samples() const {
  return static_cast<std::size_t>(
      std::count_if(chunks.begin(), chunks.end(), [](const ScheduledChunk& c) { return c.sample; }));
}

ForwardBatch SchedulerOutput::to_forward_batch() const {
  ForwardBatch batch;
  to_forward_batch(batch);
  return batch;
}

void SchedulerOutput::to_forward_batch(ForwardBatch& batch) const {
  batch.chunks.clear();
  batch.chunks.reserve(chunks.size());
  for (const ScheduledChunk& c : chunks) {
    const auto logits = c.num_drafts > 0 ? SeqChunk::Logits::all : c.sample ? SeqChunk::Logits::last : SeqChunk::Logits::none;
    batch.chunks.push_back(SeqChunk{c.tokens, c.start_pos, c.block_table, logits});
  }
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_running = static_cast<std::int32_t>(running_.size());
  s.num_waiting = static_cast<std::int32_t>(waiting_.size());
  s.num_preemptions = num_preemptions_;
  s.num_steps = step_;
  s.kv = kv_.stats();
  return s;
}

std::string Scheduler::check_integrity() const {
  if (running_.size() + waiting_.size() != seqs_.size()) return "queues do not hold every live sequence exactly once";
  if (running_.size() > static_cast<std::size_t>(config_.max_num_seqs)) {
    return "more running sequences than max_num_seqs";
  }
  for (const Sequence* s : running_) {
    if (s->status != SeqStatus::running) {
      return "sequence " + std::to_string(s->id) + " in running_ is " + to_string(s->status);
    }
  }
  for (std::size_t i = 0; i < waiting_.size(); ++i) {
    const Sequence* s = waiting_[i];
    const std::string who = "waiting sequence " + std::to_string(s->id);
    if (s->status != SeqStatus::waiting && s->status != SeqStatus::preempted) {
      return who + " is " + to_string(s->status);
    }
    if (!s->block_table.empty() || s->num_computed_tokens != 0) return who + " holds blocks or computed tokens";
    if (i > 0 && before(*s, *waiting_[i - 1])) return who + " is out of order";
  }
  std::vector<const Sequence*> live;
  live.reserve(seqs_.size());
  for (const auto& [id, seq] : seqs_) {
    if (seq->id != id) return "sequence map key mismatch";
    live.push_back(seq.get());
  }
  return kv_.check_integrity(live);
}

}  // namespace kvfleet
