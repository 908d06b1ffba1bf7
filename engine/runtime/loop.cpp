// The engine thread's loop: wait for news, take the inbox, let the lockstep say what this turn does, step.
//
//   for (;;) { wait + take the inbox; admit, abort, run KV tasks; turn: step | serve peers | idle | exit }
//
// Alone, a turn steps whenever the scheduler has work. In an expert-parallel group the ranks vote first
// (engine/runtime/lockstep.h); the loop knows only the vote's outcome.
#include <cstdio>
#include <stdexcept>

#include "engine/runtime/engine_impl.h"
#include "kvfleet/communicator.h"

namespace kvfleet {

struct Engine::Inbox {
  std::vector<Submission> submissions;
  std::vector<Impl::Abort> aborts;
  std::optional<std::string> abort_everything;
  std::vector<KvTask> tasks;
  bool stopping = false;
};

void Engine::loop() {
  Impl& m = *impl_;
  for (;;) {
    m.flush_outputs();  // the last turn's outputs (aborts, failures, a step's tokens) are all delivered
    Inbox inbox;
    if (!take_inbox(inbox)) break;
    apply(inbox);
    if (!run_turn(inbox.stopping)) break;
  }
  shut_down();
}

// Waits until there is news (as the lockstep says), then takes the inbox. False: the loop ends now.
bool Engine::take_inbox(Inbox& inbox) {
  Impl& m = *impl_;
  Scheduler& sched = *m.scheduler;
  std::unique_lock lock(m.mu);
  m.busy = sched.has_unfinished();
  if (!m.busy && m.submissions.empty() && m.aborts.empty()) m.idle.notify_all();
  const auto ready = [&] {
    return m.stop || !m.submissions.empty() || !m.aborts.empty() || !m.snapshots.empty() || m.abort_everything ||
           !m.kv_tasks.empty() || sched.has_unfinished();
  };
  if (!m.lockstep->wait(lock, m.wake, ready, m.stop)) return false;
  inbox.stopping = m.stop;
  for (auto& done : m.snapshots) {
    try {
      KvSnapshot snapshot = sched.kv().snapshot();
      if (m.tiers) m.tiers->add_to_snapshot(snapshot);
      done(std::move(snapshot));
    } catch (const std::exception& e) {  // the reader goes without; the engine goes on
      std::fprintf(stderr, "kvfleet: KV snapshot failed: %s\n", e.what());
    }
  }
  m.snapshots.clear();
  inbox.submissions.swap(m.submissions);
  inbox.aborts.swap(m.aborts);
  inbox.abort_everything.swap(m.abort_everything);
  inbox.tasks.swap(m.kv_tasks);
  m.busy = true;
  return true;
}

void Engine::apply(Inbox& inbox) {
  for (auto& s : inbox.submissions) admit(s);
  for (const auto& a : inbox.aborts) fail(a.id, a.error);
  if (inbox.abort_everything) fail_all(*inbox.abort_everything);
  for (auto& task : inbox.tasks) task(*impl_->scheduler, *impl_->backend);
}

// One turn: step, serve the group's step with an empty forward, or nothing. False: the loop ends.
bool Engine::run_turn(bool stopping) {
  Impl& m = *impl_;
  try {
    switch (m.lockstep->turn(m.scheduler->has_unfinished(), stopping)) {
      case Turn::exit:
        return false;
      case Turn::step:
        step();
        return true;
      case Turn::serve_peers:
        serve_peers();
        return true;
      case Turn::broken:  // nothing can run
        fail_all(m.lockstep->failure());
        break;
      case Turn::idle:
        break;
    }
  } catch (const CommunicatorError& e) {
    // A peer rank is gone: no step can run again. Fail what is here and whatever comes later.
    m.lockstep->failed(e.what());
    std::fprintf(stderr, "kvfleet: %s\n", e.what());
    fail_all(m.lockstep->failure());
    return true;
  } catch (const std::exception& e) {
    // Nothing says which request broke the step: fail them all rather than the process.
    fail_all(std::string("engine step failed: ") + e.what());
    return true;
  }
  std::lock_guard lock(m.stats_mu);  // aborts and tasks changed the numbers without a step
  m.stats.scheduler = m.scheduler->stats();
  return true;
}

// Shutting down: every request still here ends as aborted, and the KV tasks still queued run.
void Engine::shut_down() {
  Impl& m = *impl_;
  for (auto& [seq, a] : m.active) emit_final(a, FinishReason::aborted, {}, "the engine is shutting down");
  m.flush_outputs();
  std::vector<KvTask> tasks;
  {
    std::lock_guard lock(m.mu);
    tasks.swap(m.kv_tasks);
  }
  for (auto& task : tasks) task(*m.scheduler, *m.backend);
}

void Engine::admit(Submission& s) {
  Impl& m = *impl_;
  Active a;
  a.id = s.id;
  a.request = std::move(s.request);
  a.callback = std::move(s.callback);
  a.submitted = s.at;
  a.delivered = &m.delivered;
  a.matcher = std::move(s.matcher);
  if (a.matcher) a.mask.resize(bitmask_words(a.request.grammar->vocab_size()));
  a.accepted = static_cast<std::int32_t>(a.request.resumed_outputs.size());  // the matcher read them at submit
  try {
    SequenceParams p;
    a.num_prompt_tokens = static_cast<std::int32_t>(a.request.prompt.size());
    p.prompt = std::move(a.request.prompt);  // the scheduler's sequence holds it from here on (Sequence::prompt)
    p.priority = a.request.priority;
    p.id = s.id;  // one id: the scheduler keys the sequence by the request's id
    if (!a.request.cache_salt.empty()) p.hash_root = block_hash_root(config_.served_model_name, a.request.cache_salt);
    StopRules rules;
    if (!a.request.ignore_eos) rules.eos_ids = model_.config().eos_token_ids;
    rules.stop_token_ids = std::move(a.request.stop_token_ids);
    rules.stop_strings = std::move(a.request.stop);
    rules.max_tokens = a.request.max_tokens;
    // A sequence can never outgrow the whole cache (it would be preempted forever): treat the cache's
    // capacity as a context limit too.
    rules.max_model_len = std::min<std::int64_t>(max_model_len_, std::int64_t{config_.num_blocks} * config_.block_size);
    a.stops = StopChecker(std::move(rules), m.tokenizer, a.request.detokenize, a.request.skip_special_tokens);
    a.resumed_text = a.stops.prime(a.request.resumed_outputs, a.num_prompt_tokens);
    p.outputs = std::move(a.request.resumed_outputs);
    m.scheduler->add(std::move(p));
    m.active.emplace(s.id, std::move(a));
  } catch (const std::exception& e) {
    count_finished(FinishReason::aborted);
    emit_final(a, FinishReason::aborted, {}, e.what());
  }
}

}  // namespace kvfleet
