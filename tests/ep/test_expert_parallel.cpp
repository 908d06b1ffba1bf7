// Expert parallelism in process: the Communicator's collectives, and ModelRunner ranks (threads, each with
// its own backend, KV cache and sequences) stepping in lockstep through the MoE layers, idle ranks with
// empty batches. Every sequence's logits must equal the single-rank runner's bit for bit, for ep_size 1, 2, 4.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <thread>

#include "runtime/engine_harness.h"
#include "kvfleet/communicator.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

struct Seq {
  std::vector<TokenId> prompt;
  std::vector<TokenId> decode;  // fed one per step after the prompt
};

std::vector<Seq> workload() {
  std::vector<Seq> out;
  for (int i = 0; i < 7; ++i) {
    Seq s;
    for (int t = 0; t < 5 + 7 * i % 29; ++t) s.prompt.push_back(static_cast<TokenId>((t * 31 + i * 17 + 3) % 200));
    for (int t = 0; t < (i * 5) % 7; ++t) s.decode.push_back(static_cast<TokenId>((t * 13 + i) % 200));
    out.push_back(s);
  }
  return out;
}

using Logits = std::map<std::pair<int, int>, std::vector<float>>;  // (sequence, step) -> last-position logits

// Runs `mine` (indices into seqs) on one runner: step 0 prefills them all, step s feeds decode token s - 1;
// `steps` steps in all, empty ones included (lockstep).
Logits run_rank(const Model& model, const std::vector<Seq>& seqs, const std::vector<int>& mine, int steps,
                Communicator* ep) {
  auto backend = make_cpu_backend(1);
  RunnerOptions ro;
  ro.num_blocks = 4 * static_cast<std::int64_t>(seqs.size());
  ro.ep = ep;
  ModelRunner runner(model, *backend, ro);
  std::vector<std::vector<std::int32_t>> tables(seqs.size());
  for (int i : mine)
    for (int b = 0; b < 4; ++b) tables[static_cast<std::size_t>(i)].push_back(4 * i + b);
  Logits out;
  const auto vocab = static_cast<std::size_t>(model.config().vocab_size);
  for (int step = 0; step < steps; ++step) {
    ForwardBatch batch;
    std::vector<int> in_batch;
    for (int i : mine) {
      const Seq& s = seqs[static_cast<std::size_t>(i)];
      const auto& table = tables[static_cast<std::size_t>(i)];
      if (step == 0) {
        batch.chunks.push_back({s.prompt, 0, table, SeqChunk::Logits::last});
      } else if (step <= static_cast<int>(s.decode.size())) {
        const std::span<const TokenId> all(s.decode);
        batch.chunks.push_back({all.subspan(static_cast<std::size_t>(step - 1), 1),
                                static_cast<std::int32_t>(s.prompt.size()) + step - 1, table, SeqChunk::Logits::last});
      } else {
        continue;
      }
      in_batch.push_back(i);
    }
    const auto logits = runner.forward(batch);
    for (std::size_t j = 0; j < in_batch.size(); ++j)
      out[{in_batch[j], step}] = std::vector<float>(logits.begin() + static_cast<std::ptrdiff_t>(j * vocab),
                                                    logits.begin() + static_cast<std::ptrdiff_t>((j + 1) * vocab));
  }
  return out;
}

void check_ep_equals_single_rank(const Model& model) {
  const auto seqs = workload();
  int steps = 1;
  for (const auto& s : seqs) steps = std::max(steps, 1 + static_cast<int>(s.decode.size()));
  // Single rank, each sequence alone (no EP): the reference.
  Logits want;
  for (int i = 0; i < static_cast<int>(seqs.size()); ++i) {
    const auto one = run_rank(model, seqs, {i}, steps, nullptr);
    want.insert(one.begin(), one.end());
  }
  for (int ep : {1, 2, 4}) {
    CAPTURE(ep);
    // Uneven assignment: rank r takes the sequences i with i % (ep + 1) == r; the last index goes to rank
    // 0, and with ep 4 rank 3 also gets few (and is idle for most steps).
    std::vector<std::vector<int>> mine(static_cast<std::size_t>(ep));
    for (int i = 0; i < static_cast<int>(seqs.size()); ++i) mine[static_cast<std::size_t>((i % (ep + 1)) % ep)].push_back(i);
    if (ep == 4) mine[2].clear(), mine[0].insert(mine[0].end(), {2, 6});  // rank 2 idle throughout
    auto comms = make_in_process_group(ep);
    std::vector<Logits> got(static_cast<std::size_t>(ep));
    std::vector<std::string> errors(static_cast<std::size_t>(ep));
    std::vector<std::thread> threads;
    for (int r = 0; r < ep; ++r)
      threads.emplace_back([&, r] {
        try {
          got[static_cast<std::size_t>(r)] = run_rank(model, seqs, mine[static_cast<std::size_t>(r)], steps,
                                                      comms[static_cast<std::size_t>(r)].get());
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    Logits all;
    for (int r = 0; r < ep; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)].empty());
      all.insert(got[static_cast<std::size_t>(r)].begin(), got[static_cast<std::size_t>(r)].end());
    }
    REQUIRE(all.size() == want.size());
    for (const auto& [key, row] : want) {
      const auto seq = key.first, position = key.second;  // clang 14: no structured binding in CAPTURE
      CAPTURE(seq);
      CAPTURE(position);
      const auto& g = all.at(key);
      CHECK(std::memcmp(g.data(), row.data(), row.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("in-process communicator: variable-count all-to-all, all-gather and barrier") {
  const int n = 3;
  auto comms = make_in_process_group(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Communicator& c = *comms[static_cast<std::size_t>(r)];
      for (int round = 0; round < 50; ++round) {
        // Rank r sends (r + round) % 3 * d bytes of value 10 r + d to rank d (zero-length pieces included).
        std::vector<std::size_t> sizes;
        std::vector<std::uint8_t> send;
        for (int d = 0; d < n; ++d) {
          const std::size_t len = static_cast<std::size_t>(((r + round) % 3) * d);
          sizes.push_back(len);
          send.insert(send.end(), len, static_cast<std::uint8_t>(10 * r + d));
        }
        std::vector<std::size_t> got;
        const auto recv = c.all_to_all_v(send.data(), sizes, got);
        std::size_t at = 0;
        for (int src = 0; src < n; ++src) {
          const std::size_t len = static_cast<std::size_t>(((src + round) % 3) * r);
          if (got[static_cast<std::size_t>(src)] != len) errors[static_cast<std::size_t>(r)] = "piece size";
          for (std::size_t i = 0; i < len; ++i)
            if (recv[at + i] != 10 * src + r) errors[static_cast<std::size_t>(r)] = "piece content";
          at += len;
        }
        const std::int32_t mine = 100 * round + r;
        std::int32_t all[n];
        c.all_gather(&mine, sizeof mine, all);
        for (int src = 0; src < n; ++src)
          if (all[src] != 100 * round + src) errors[static_cast<std::size_t>(r)] = "all_gather";
        c.barrier();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(comms[1]->rank() == 1);
  CHECK(comms[1]->size() == 3);
}

TEST_CASE("expert parallel ranks (mixtral, bf16): logits identical to single-rank for ep_size 1, 2, 4") {
  test::TempDir dir;
  MakeModelOptions o;
  o.arch = "mixtral";
  o.dtype = DType::bf16;
  o.vocab = 200;
  o.experts = 8;
  o.experts_per_tok = 2;
  make_model(o, dir.path());
  check_ep_equals_single_rank(Model::load(dir.path()));
}

TEST_CASE("expert parallel ranks (qwen2_moe: shared expert, a dense layer, packed): identical for ep_size 1, 2, 4") {
  test::TempDir dir;
  MakeModelOptions o;
  o.arch = "qwen2_moe";
  o.vocab = 200;
  o.layers = 3;
  o.mlp_only_layers = {1};
  o.experts = 8;
  o.experts_per_tok = 3;
  o.packed_experts = true;
  make_model(o, dir.path());
  check_ep_equals_single_rank(Model::load(dir.path()));
}

TEST_CASE("expert parallelism needs the experts to split evenly over the ranks") {
  test::TempDir dir;
  MakeModelOptions o;
  o.arch = "mixtral";
  o.vocab = 64;
  o.experts = 6;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  auto comms = make_in_process_group(4);
  auto backend = make_cpu_backend(1);
  RunnerOptions ro;
  ro.ep = comms[0].get();
  CHECK_THROWS_WITH_AS(ModelRunner(model, *backend, ro), "6 experts do not split over ep_size 4", std::invalid_argument);
}

TEST_CASE("expert-parallel engines in lockstep: every request's tokens equal the single engine's") {
  test::TempDir dir;
  MakeModelOptions o;
  o.arch = "qwen3_moe";
  o.dtype = DType::bf16;
  o.vocab = 300;
  o.experts = 8;
  o.experts_per_tok = 2;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  const auto requests = test::equivalence_requests(300);
  EngineConfig c;
  c.num_blocks = 128;  // no preemption, and no prefix cache: each rank would hit its own cache differently,
  c.enable_prefix_caching = false;  // so the tokens computed (the expert load) would differ from one engine's
  c.scheduler.max_num_batched_tokens = 64;  // chunked prefill, several steps per rank
  c.scheduler.max_num_seqs = 8;
  c.backend.kind = "cpu";
  c.backend.threads = 1;
  std::map<std::size_t, test::Collected> want;
  std::vector<std::uint64_t> want_load;
  {
    Engine engine(model, c);
    test::Collector col;
    for (std::size_t i = 0; i < requests.size(); ++i) engine.submit(requests[i], col.callback(i));
    engine.wait_idle();
    want = col.results();
    want_load = engine.stats().moe.expert_tokens;
  }
  REQUIRE(want_load.size() == 8);
  for (int ep : {2, 4}) {
    CAPTURE(ep);
    auto comms = make_in_process_group(ep);
    std::vector<std::unique_ptr<Engine>> engines;
    for (int r = 0; r < ep; ++r) {
      EngineConfig rc = c;
      rc.ep = comms[static_cast<std::size_t>(r)].get();
      engines.push_back(std::make_unique<Engine>(model, rc));
    }
    test::Collector col;
    // Uneven: rank 0 takes half of the requests, the last rank only every sixth.
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const std::size_t r = i % 2 == 0 ? 0 : (i % 6 == 1 ? static_cast<std::size_t>(ep - 1) : 1 % static_cast<std::size_t>(ep));
      engines[r]->submit(requests[i], col.callback(i));
    }
    for (auto& e : engines) e->wait_idle();
    const auto got = col.results();
    REQUIRE(got.size() == want.size());
    for (const auto& [i, w] : want) {
      const auto request_id = i;  // clang 14: no structured binding in CAPTURE
      CAPTURE(request_id);
      CHECK(got.at(i).tokens == w.tokens);
      CHECK(got.at(i).finals == 1);
    }
    // Each rank counts what its own experts computed: summed over the ranks, the single engine's load.
    std::vector<std::uint64_t> load(8, 0);
    for (int r = 0; r < ep; ++r) {
      const auto s = engines[static_cast<std::size_t>(r)]->stats().moe;
      REQUIRE(s.expert_tokens.size() == 8);
      for (std::size_t e = 0; e < 8; ++e) {
        load[e] += s.expert_tokens[e];
        const bool held = static_cast<int>(e) / (8 / ep) == r;
        if (!held) CHECK(s.expert_tokens[e] == 0);
      }
      CHECK(s.last_imbalance >= 1.0);
      CHECK(s.last_imbalance <= 8.0 / ep);
    }
    CHECK(load == want_load);
    engines.clear();  // the first destructor stops the group; the others find their loops ended
  }
}
