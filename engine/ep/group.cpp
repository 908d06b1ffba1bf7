// EpGroup (kvfleet/ep_group.h): N expert-parallel ranks (in-process engines, or this process's engine
// and remote ranks behind their channels), the dispatcher over their caches and the merged KV event ring. The state is fed by a listener on each rank's ring, which runs on that rank's
// engine thread right after each publish, so it sees every event (no replay gap) and the union is always
// up to date with what the ranks published.
#include "kvfleet/ep_group.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "engine/comm/tcp_store.h"
#include "engine/ep/paced_comm.h"
#include "engine/ep/remote_rank.h"
#include "engine/ep/wire.h"
#include "kvfleet/communicator.h"

namespace kvfleet {

namespace {

class LocalRank final : public EpRank {
 public:
  explicit LocalRank(Engine& e) : e_(e) {}
  RequestId submit(GenerationRequest request, OutputCallback on_output) override {
    return e_.submit(std::move(request), std::move(on_output));
  }
  void abort(RequestId id) override { e_.abort(id); }
  void abort_all(const std::string& error) override { e_.abort_all(error); }
  EngineStats stats() const override { return e_.stats(); }
  std::shared_ptr<KvEventRing> kv_events() const override { return e_.kv_events(); }
  void kv_state(std::function<void(boost::json::object)> done) override {
    e_.run_kv_task([done = std::move(done)](Scheduler& s, Backend&) { done(ep::kv_state_json(s)); });
  }

 private:
  Engine& e_;
};

// One request in flight: its callback, called at most once with a final output, whether that comes from
// its rank or from the group failing.
struct Inflight {
  std::mutex mu;
  bool done = false;
  OutputCallback cb;
  std::function<void()> release;
  void deliver(const RequestOutput& o) {
    {
      std::lock_guard lock(mu);
      if (done) return;
      done = o.finished;
      if (cb) cb(o);
    }
    if (o.finished) release();
  }
};

}  // namespace

struct EpGroup::State {
  explicit State(int n) : rank_blocks(n), inflight(n), load(n, 0), last_seen(n, 0) {}
  std::mutex mu;
  std::string failed;  // why the group broke; empty while whole
  std::uint64_t next_request = 1;
  std::unordered_map<std::uint64_t, std::shared_ptr<Inflight>> requests;

  std::string failure() {
    std::lock_guard lock(mu);
    return failed;
  }
  // A rank is gone: every request in flight ends now with `why` (none can step again).
  void fail(const std::string& why) {
    std::vector<std::shared_ptr<Inflight>> all;
    bool first = false;
    {
      std::lock_guard lock(mu);
      first = failed.empty();
      if (first) failed = why;
      for (auto& [k, r] : requests) all.push_back(r);
    }
    if (first) std::fprintf(stderr, "kvfleet: the expert-parallel group broke: %s\n", why.c_str());
    RequestOutput o;
    o.finished = true;
    o.finish_reason = FinishReason::aborted;
    o.error = why;
    for (auto& r : all) r->deliver(o);
  }

  std::string served_name;
  std::int32_t block_size = 16;
  std::shared_ptr<KvEventRing> merged;
  std::shared_ptr<KvEventRing> per_rank;  // every rank's own changes, each with its dp_rank (per_rank=1 readers)
  std::vector<std::shared_ptr<KvEventRing>> rings;
  struct BlockHolders {  // a block in the union: how many ranks hold it, and its parent
    int count = 0;
    BlockHash parent = 0;
  };
  std::unordered_map<BlockHash, BlockHolders> held;                    // the union: ranks holding each hash
  std::vector<std::unordered_map<BlockHash, BlockHash>> rank_blocks;    // per rank: hash -> parent
  std::vector<std::unordered_map<BlockHash, int>> inflight;            // per rank: running prompts' hashes
  std::vector<std::int64_t> load;                                      // per rank: unfinished requests
  std::vector<std::uint64_t> last_seen;                                // per rank: last event applied

  void stored(int r, const std::vector<BlockHash>& chain, BlockHash parent) {
    per_rank->publish(KvEvent::Type::stored, chain, parent, r);
    std::vector<BlockHash> run;
    BlockHash run_parent = 0;
    auto flush = [&] {
      if (!run.empty()) merged->publish(KvEvent::Type::stored, std::move(run), run_parent, r);
      run.clear();
    };
    for (std::size_t i = 0; i < chain.size(); ++i) {
      const BlockHash p = i ? chain[i - 1] : parent;
      const bool new_here = rank_blocks[static_cast<std::size_t>(r)].emplace(chain[i], p).second;
      BlockHolders& h = held[chain[i]];
      if (new_here && ++h.count == 1) {
        h.parent = p;
        if (run.empty()) run_parent = p;
        run.push_back(chain[i]);
      } else {
        flush();  // another rank holds it already: the group's chain goes on past it unannounced
      }
    }
    flush();
  }

  void removed(int r, const std::vector<BlockHash>& hashes) {
    std::vector<BlockHash> gone, gone_here;
    for (BlockHash h : hashes) {
      if (!rank_blocks[static_cast<std::size_t>(r)].erase(h)) continue;
      gone_here.push_back(h);
      auto it = held.find(h);
      if (it != held.end() && --it->second.count == 0) {
        held.erase(it);
        gone.push_back(h);
      }
    }
    if (!gone.empty()) merged->publish(KvEvent::Type::removed, std::move(gone), 0, r);
    if (!gone_here.empty()) per_rank->publish(KvEvent::Type::removed, std::move(gone_here), 0, r);
  }

  void cleared(int r) {
    std::vector<BlockHash> all;
    for (const auto& [h, p] : rank_blocks[static_cast<std::size_t>(r)]) all.push_back(h);
    removed(r, all);
  }

  // Caller holds mu.
  void drain(int r) {
    const KvReplay replay = rings[static_cast<std::size_t>(r)]->since(last_seen[static_cast<std::size_t>(r)]);
    if (replay.fell_behind) {  // cannot happen with a listener per publish; say so rather than drift
      std::fprintf(stderr, "kvfleet: expert-parallel rank %d's KV events fell behind the merged stream\n", r);
      last_seen[static_cast<std::size_t>(r)] = replay.last_seq;
      return;
    }
    for (const KvEvent& e : replay.events) {
      if (e.type == KvEvent::Type::stored) stored(r, e.block_hashes, e.parent);
      else if (e.type == KvEvent::Type::removed) removed(r, e.block_hashes);
      else cleared(r);
      last_seen[static_cast<std::size_t>(r)] = e.seq;
    }
  }

  std::vector<BlockHash> chain_of(std::span<const TokenId> prompt, const std::string& salt) const {
    return block_hashes(block_hash_root(served_name, salt), prompt, static_cast<std::size_t>(block_size));
  }
  // A hash of the prompt's first 16 tokens: pick()'s tie-break between equally loaded ranks.
  static std::uint64_t tie_break_of(std::span<const TokenId> prompt) {
    return block_hash_next(block_hash_root("ep"), prompt.first(std::min<std::size_t>(prompt.size(), 16)));
  }

  // Caller holds mu. `tie_break`: a hash of the prompt, which breaks ties between equally loaded ranks (so
  // that distinct prompts arriving one at a time do not all land on rank 0).
  int pick(const std::vector<BlockHash>& chain, std::uint64_t tie_break) const {
    int best = -1;
    std::size_t best_len = 0;
    for (int r = 0; r < static_cast<int>(load.size()); ++r) {
      const auto& blocks = rank_blocks[static_cast<std::size_t>(r)];
      const auto& running = inflight[static_cast<std::size_t>(r)];
      std::size_t n = 0;
      while (n < chain.size() && (blocks.count(chain[n]) || running.count(chain[n]))) ++n;
      if (n > best_len) best = r, best_len = n;
    }
    if (best >= 0) return best;
    const std::int64_t least = *std::min_element(load.begin(), load.end());
    std::vector<int> idle;
    for (int r = 0; r < static_cast<int>(load.size()); ++r)
      if (load[static_cast<std::size_t>(r)] == least) idle.push_back(r);
    return idle[static_cast<std::size_t>(tie_break % idle.size())];
  }
};

EpGroup::EpGroup(const Model& model, const EngineConfig& config, int ep_size) : state_(std::make_shared<State>(ep_size)) {
  if (ep_size < 1) throw std::invalid_argument("--ep-size must be at least 1");
  if (ep_size > 1 && !model.config().moe.enabled()) throw std::invalid_argument("--ep-size needs a mixture-of-experts model");
  comms_ = make_in_process_group(ep_size);
  EngineConfig ec = config;
  state_->served_name = ec.served_model_name.empty() ? model.name() : ec.served_model_name;
  state_->block_size = ec.block_size;
  for (int r = 0; r < ep_size; ++r) {
    ec.ep = ep_size > 1 ? comms_[static_cast<std::size_t>(r)].get() : nullptr;
    engines_.push_back(std::make_unique<Engine>(model, ec));
    ranks_.push_back(std::make_unique<LocalRank>(*engines_.back()));
  }
  start_merging();
}

EpGroup::EpGroup(const Model& model, const EngineConfig& config, const EpCommOptions& opts)
    : state_(std::make_shared<State>(opts.size)) {
  if (opts.rank != 0) throw std::invalid_argument("the front of an expert-parallel group is rank 0");
  if (opts.size > 1 && !model.config().moe.enabled()) throw std::invalid_argument("--ep-size needs a mixture-of-experts model");
  EngineConfig ec = config;
  comms_.push_back(make_ep_communicator(opts, ec.backend));  // NCCL: ec.backend.device is its GPU
  auto front = std::make_unique<ep::FrontCommunicator>(*comms_[0], [s = std::weak_ptr<State>(state_)](const std::string& why) {
    auto st = s.lock();
    if (!st) return;
    // A dead peer resets Gloo's connections and its channel together; the channel's verdict names it.
    for (int i = 0; i < 100 && st->failure().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const std::string named = st->failure();
    st->fail(named.empty() ? why : named);
  });
  ep::FrontCommunicator* paced = front.get();
  comms_.push_back(std::move(front));
  ec.ep = comms_[1].get();
  state_->served_name = ec.served_model_name.empty() ? model.name() : ec.served_model_name;
  state_->block_size = ec.block_size;
  engines_.push_back(std::make_unique<Engine>(model, ec));
  ranks_.push_back(std::make_unique<LocalRank>(*engines_.back()));
  const auto [host, port] = comm::parse_host_port(opts.master);
  const auto join = std::max(opts.timeout, opts.join_timeout);
  comm::TcpStoreClient store(host, port, join);
  const auto& own = engines_[0]->kv_events();
  std::vector<ep::TicketLink*> remotes;
  try {
    for (int r = 1; r < opts.size; ++r) {
      std::vector<char> where;
      try {
        where = store.get(ep::channel_key(r));
      } catch (const std::exception& e) {
        throw std::runtime_error("expert-parallel rank " + std::to_string(r) + " did not publish its request channel: " + e.what());
      }
      const auto [rhost, rport] = comm::parse_host_port(std::string(where.begin(), where.end()));
      const int fd = ep::connect_tcp(rhost, rport, join);
      auto ring = std::make_shared<KvEventRing>(KvCacheConfig{}.event_ring_capacity, own->block_size(), own->root());
      auto remote = std::make_unique<ep::RemoteRank>(r, opts.size, fd, std::move(ring), opts.timeout);
      remotes.push_back(remote.get());
      ranks_.push_back(std::move(remote));
    }
  } catch (const std::exception& e) {
    paced->shutdown(e.what());  // this rank's engine stops waiting for the others' votes
    throw;
  }
  paced->attach(remotes);
  start_merging();
  for (auto& rank : ranks_) rank->on_failure([s = std::weak_ptr<State>(state_)](const std::string& why) {
    if (auto st = s.lock()) st->fail(why);
  });
}

void EpGroup::start_merging() {
  for (auto& rank : ranks_) state_->rings.push_back(rank->kv_events());
  const auto& first = state_->rings[0];
  state_->per_rank = std::make_shared<KvEventRing>(KvCacheConfig{}.event_ring_capacity, first->block_size(), first->root());
  state_->merged = std::make_shared<KvEventRing>(KvCacheConfig{}.event_ring_capacity, first->block_size(), first->root());
  for (int r = 0; r < size(); ++r) {
    subscriptions_.push_back(state_->rings[static_cast<std::size_t>(r)]->subscribe([s = state_, r] {
      std::lock_guard lock(s->mu);
      s->drain(r);
    }));
    std::lock_guard lock(state_->mu);  // what a remote rank sent before the listener was there
    state_->drain(r);
  }
}

EpGroup::~EpGroup() {
  subscriptions_.clear();
  engines_.clear();  // the first engine destroyed stops the whole group's loops
  ranks_.clear();    // remote ranks: their channels close, and their processes end
}

int EpGroup::size() const { return static_cast<int>(ranks_.size()); }
bool EpGroup::rank_in_process(int r) const { return ranks_.at(static_cast<std::size_t>(r))->in_process(); }
Engine& EpGroup::rank(int r) { return *engines_.at(static_cast<std::size_t>(r)); }
void EpGroup::set_tokenizer(const Tokenizer* tokenizer) {
  for (auto& e : engines_) e->set_tokenizer(tokenizer);
}

std::string EpGroup::failure() const { return state_->failure(); }

int EpGroup::pick(std::span<const TokenId> prompt, const std::string& cache_salt) const {
  const auto chain = state_->chain_of(prompt, cache_salt);
  std::lock_guard lock(state_->mu);
  return state_->pick(chain, State::tie_break_of(prompt));
}

EpGroup::Submitted EpGroup::submit(GenerationRequest request, OutputCallback on_output, int dp_rank) {
  if (dp_rank >= size()) throw std::out_of_range("data_parallel_rank " + std::to_string(dp_rank) + " is out of range [0, " +
                                                 std::to_string(size()) + ")");
  if (request.grammar && dp_rank >= 0 && !rank_in_process(dp_rank))
    throw std::invalid_argument("data_parallel_rank " + std::to_string(dp_rank) +
                                " runs in another process, where constrained decoding (structured outputs) is not "
                                "available: only the ranks in rank 0's process run it");
  auto chain = std::make_shared<std::vector<BlockHash>>(state_->chain_of(request.prompt, request.cache_salt));
  Submitted s;
  auto entry = std::make_shared<Inflight>();
  std::uint64_t key = 0;
  {
    std::lock_guard lock(state_->mu);
    if (!state_->failed.empty()) throw std::runtime_error(state_->failed);
    s.rank = state_->pick(*chain, State::tie_break_of(request.prompt));
    if (dp_rank >= 0) s.rank = dp_rank;  // a router that follows the ranks' caches named the rank
    else if (request.grammar && !ranks_[static_cast<std::size_t>(s.rank)]->in_process()) s.rank = 0;
    state_->load[static_cast<std::size_t>(s.rank)] += 1;
    for (BlockHash h : *chain) state_->inflight[static_cast<std::size_t>(s.rank)][h] += 1;
    key = state_->next_request++;
    state_->requests[key] = entry;
  }
  // The request stops counting when its final output arrives (or submit throws).
  entry->cb = std::move(on_output);
  entry->release = [st = state_, r = s.rank, chain, key] {
    std::lock_guard lock(st->mu);
    st->requests.erase(key);
    st->load[static_cast<std::size_t>(r)] -= 1;
    auto& running = st->inflight[static_cast<std::size_t>(r)];
    for (BlockHash h : *chain)
      if (auto it = running.find(h); it != running.end() && --it->second == 0) running.erase(it);
  };
  try {
    s.id = ranks_[static_cast<std::size_t>(s.rank)]->submit(std::move(request),
                                                             [entry](const RequestOutput& o) { entry->deliver(o); });
  } catch (...) {
    {
      std::lock_guard lock(entry->mu);
      entry->done = true;  // nothing more reaches the caller's callback
    }
    entry->release();
    throw;
  }
  return s;
}

void EpGroup::abort(const Submitted& s) { ranks_.at(static_cast<std::size_t>(s.rank))->abort(s.id); }

void EpGroup::abort_all(const std::string& error) {
  for (auto& r : ranks_) r->abort_all(error);
}

namespace {

// The group's figures from its ranks' (see EpGroup::stats).
EngineStats sum_of(const std::vector<EngineStats>& ranks) {
  EngineStats sum;
  for (const EngineStats& s : ranks) {
    sum.prompt_tokens += s.prompt_tokens;
    sum.generated_tokens += s.generated_tokens;
    sum.steps = std::max(sum.steps, s.steps);  // lockstep: every rank counts the group's steps it computed in
    for (std::size_t i = 0; i < sum.finished.size(); ++i) sum.finished[i] += s.finished[i];
    auto& a = sum.scheduler;
    a.num_running += s.scheduler.num_running;
    a.num_waiting += s.scheduler.num_waiting;
    a.num_preemptions += s.scheduler.num_preemptions;
    a.num_steps = std::max(a.num_steps, s.scheduler.num_steps);
    a.kv.num_blocks += s.scheduler.kv.num_blocks;
    a.kv.num_free_blocks += s.scheduler.kv.num_free_blocks;
    a.kv.num_cached_blocks += s.scheduler.kv.num_cached_blocks;
    a.kv.prefix_query_tokens += s.scheduler.kv.prefix_query_tokens;
    a.kv.prefix_hit_tokens += s.scheduler.kv.prefix_hit_tokens;
    a.kv.evicted_blocks += s.scheduler.kv.evicted_blocks;
    a.kv.usage = a.kv.num_blocks ? 1.0 - static_cast<double>(a.kv.num_free_blocks) / a.kv.num_blocks : 0.0;
    if (sum.moe.expert_tokens.size() < s.moe.expert_tokens.size()) sum.moe.expert_tokens.resize(s.moe.expert_tokens.size());
    for (std::size_t x = 0; x < s.moe.expert_tokens.size(); ++x) sum.moe.expert_tokens[x] += s.moe.expert_tokens[x];
    sum.moe.steps = std::max(sum.moe.steps, s.moe.steps);
    sum.moe.last_imbalance = std::max(sum.moe.last_imbalance, s.moe.last_imbalance);
    sum.moe.imbalance_sum = std::max(sum.moe.imbalance_sum, s.moe.imbalance_sum);
  }
  return sum;
}

}  // namespace

EngineStats EpGroup::stats() const {
  std::vector<EngineStats> all;
  for (const auto& rank : ranks_) all.push_back(rank->stats());
  return sum_of(all);
}

void EpGroup::stats_now(std::function<void(EngineStats)> done) const {
  struct Gather {
    std::mutex mu;
    std::vector<EngineStats> answers;
    std::size_t left;
    std::function<void(EngineStats)> done;
  };
  auto g = std::make_shared<Gather>();
  g->answers.resize(ranks_.size());
  g->left = ranks_.size();
  g->done = std::move(done);
  for (std::size_t r = 0; r < ranks_.size(); ++r)
    ranks_[r]->stats_now([g, r](EngineStats s) {
      {
        std::lock_guard lock(g->mu);
        g->answers[r] = std::move(s);
        if (--g->left > 0) return;
      }
      g->done(sum_of(g->answers));  // the last answer: nobody else touches answers now
    });
}

std::shared_ptr<KvEventRing> EpGroup::kv_events() const { return state_->merged; }

KvSnapshot EpGroup::kv_snapshot() const {
  std::lock_guard lock(state_->mu);
  KvSnapshot snap;
  snap.seq = state_->merged->last_seq();
  // Parents first: start from blocks whose parent the group does not hold, then their children.
  std::unordered_map<BlockHash, std::vector<BlockHash>> children;
  std::vector<BlockHash> frontier;
  for (const auto& [h, held] : state_->held) {
    if (state_->held.count(held.parent)) children[held.parent].push_back(h);
    else frontier.push_back(h);
  }
  while (!frontier.empty()) {
    const BlockHash h = frontier.back();
    frontier.pop_back();
    snap.blocks.push_back({h, state_->held.at(h).parent});
    if (auto it = children.find(h); it != children.end())
      for (BlockHash c : it->second) frontier.push_back(c);
  }
  return snap;
}

std::shared_ptr<KvEventRing> EpGroup::kv_events_per_rank() const { return state_->per_rank; }

// Each rank's cache, parents first within the rank, at the per-rank ring's seq.
EpGroup::RankedSnapshot EpGroup::kv_snapshot_per_rank() const {
  std::lock_guard lock(state_->mu);
  RankedSnapshot snap;
  snap.seq = state_->per_rank->last_seq();
  for (std::size_t r = 0; r < state_->rank_blocks.size(); ++r) {
    const auto& blocks = state_->rank_blocks[r];
    std::unordered_map<BlockHash, std::vector<BlockHash>> children;
    std::vector<BlockHash> frontier;
    for (const auto& [h, parent] : blocks) {
      if (blocks.count(parent)) children[parent].push_back(h);
      else frontier.push_back(h);
    }
    while (!frontier.empty()) {
      const BlockHash h = frontier.back();
      frontier.pop_back();
      snap.blocks.push_back({h, blocks.at(h), static_cast<std::int32_t>(r)});
      if (auto it = children.find(h); it != children.end())
        for (BlockHash c : it->second) frontier.push_back(c);
    }
  }
  return snap;
}

std::int64_t EpGroup::unfinished(int rank) const {
  std::lock_guard lock(state_->mu);
  return state_->load.at(static_cast<std::size_t>(rank));
}

EngineStats EpGroup::rank_stats(int rank) const { return ranks_.at(static_cast<std::size_t>(rank))->stats(); }

}  // namespace kvfleet
