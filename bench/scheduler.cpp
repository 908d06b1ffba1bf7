// Scheduler + KV cache bookkeeping cost per engine step, without a model: 256 sequences in decode
// plus a waiting queue. Each step does what the engine thread does around the forward pass:
// schedule(), to_forward_batch(), update() with one fake token per sampling chunk, the stop check
// (max_tokens), finish() for the sequences that are done and add() of new requests, so the batch
// stays at 256 running with an occasional 64-token prefill (48 of them shared: prefix hits).
// Goal: under 50 us per step. Arg: 1 = prefix caching on, 0 = off.
#include "kvfleet/scheduler.h"

#include <benchmark/benchmark.h>

#include <vector>

namespace {

using namespace kvfleet;

constexpr int kRunning = 256;
constexpr int kWaiting = 32;
constexpr int kMaxTokens = 256;
constexpr int kBlockSize = 16;

std::vector<TokenId> make_prompt(int n) {
  std::vector<TokenId> p;
  for (int i = 0; i < 48; ++i) p.push_back(1000 + i);  // shared system prompt: 3 full blocks
  for (int i = 0; i < 16; ++i) p.push_back((n * 31 + i) % 32000);
  return p;
}

struct Workload {
  explicit Workload(bool prefix_caching) : sched(sched_cfg(), kv_cfg(prefix_caching)) {
    // Staggered lengths so that about one sequence finishes per step once warm.
    for (int i = 0; i < kRunning + kWaiting; ++i) add(kMaxTokens - (i % kMaxTokens));
  }

  static SchedulerConfig sched_cfg() {
    SchedulerConfig c;
    c.max_num_seqs = kRunning;
    c.max_num_batched_tokens = 2048;
    return c;
  }
  static KvCacheConfig kv_cfg(bool prefix_caching) {
    KvCacheConfig c;
    c.num_blocks = (kRunning + 8) * ((64 + kMaxTokens) / kBlockSize + 1);
    c.block_size = kBlockSize;
    c.root = block_hash_root("bench-model");
    c.enable_prefix_caching = prefix_caching;
    return c;
  }

  void add(int max_tokens) {
    SequenceParams p;
    p.prompt = make_prompt(next_++);
    const SeqId id = sched.add(std::move(p));
    if (max_tokens_.size() <= id) max_tokens_.resize(id * 2 + 1);
    max_tokens_[id] = max_tokens;
  }

  void step() {
    sched.schedule(out);
    out.to_forward_batch(batch);
    benchmark::DoNotOptimize(batch.chunks.data());
    sampled_.assign(out.num_samples(), static_cast<TokenId>(out.step % 32000));
    sched.update(out, sampled_);
    done_.clear();
    for (const ScheduledChunk& c : out.chunks) {
      if (c.sample && c.sequence().num_output_tokens() >= max_tokens_[c.id]) done_.push_back(c.id);
    }
    for (const SeqId id : done_) {
      sched.finish(id, FinishReason::length);
      add(kMaxTokens);
    }
  }

  Scheduler sched;
  SchedulerOutput out;
  ForwardBatch batch;
  std::vector<int> max_tokens_;
  std::vector<TokenId> sampled_;
  std::vector<SeqId> done_;
  int next_ = 0;
};

void BM_scheduler_step(benchmark::State& state) {
  Workload w(state.range(0) != 0);
  for (int i = 0; i < 2 * kMaxTokens; ++i) w.step();  // warm: admitted, prefilled, finishing in turn
  for (auto _ : state) w.step();
  const SchedulerStats s = w.sched.stats();
  state.counters["running"] = s.num_running;
  state.counters["waiting"] = s.num_waiting;
  state.counters["kv_usage"] = s.kv.usage;
  state.counters["preemptions"] = static_cast<double>(s.num_preemptions);
  state.counters["hit_ratio"] = s.kv.prefix_query_tokens ? static_cast<double>(s.kv.prefix_hit_tokens) /
                                                               static_cast<double>(s.kv.prefix_query_tokens)
                                                         : 0.0;
}
BENCHMARK(BM_scheduler_step)->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
