// Shared by the NCCL tests: ModelRunner ranks of an expert-parallel group on any backend, each running its
// own sequences in lockstep (idle ranks with empty batches), and the logits they produce.
#pragma once

#include <map>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvfleet/backend.h"
#include "kvfleet/communicator.h"
#include "kvfleet/model.h"
#include "kvfleet/model_runner.h"

namespace kvfleet::test {

struct EpSeq {
  std::vector<TokenId> prompt;
  std::vector<TokenId> decode;  // fed one per step after the prompt
};

// 6 sequences of 4 to 30 tokens, 0 to 4 decode steps each.
inline std::vector<EpSeq> ep_workload() {
  std::vector<EpSeq> out;
  for (int i = 0; i < 6; ++i) {
    EpSeq s;
    for (int t = 0; t < 4 + 9 * i % 27; ++t) s.prompt.push_back(static_cast<TokenId>((t * 29 + i * 13 + 5) % 200));
    for (int t = 0; t < (i * 3) % 5; ++t) s.decode.push_back(static_cast<TokenId>((t * 11 + i) % 200));
    out.push_back(s);
  }
  return out;
}

inline int ep_steps(const std::vector<EpSeq>& seqs) {
  int steps = 1;
  for (const auto& s : seqs) steps = std::max(steps, 1 + static_cast<int>(s.decode.size()));
  return steps;
}

using EpLogits = std::map<std::pair<int, int>, std::vector<float>>;  // (sequence, step) -> last-position logits

// Runs `mine` (indices into seqs) on one runner: step 0 prefills them all, step s feeds decode token s - 1;
// `steps` steps in all, empty ones included (lockstep with the other ranks).
inline EpLogits run_ep_rank(const Model& model, Backend& backend, const std::vector<EpSeq>& seqs,
                            const std::vector<int>& mine, int steps, Communicator* ep) {
  RunnerOptions ro;
  ro.num_blocks = 4 * static_cast<std::int64_t>(seqs.size());
  ro.ep = ep;
  ModelRunner runner(model, backend, ro);
  std::vector<std::vector<std::int32_t>> tables(seqs.size());
  for (int i : mine)
    for (int b = 0; b < 4; ++b) tables[static_cast<std::size_t>(i)].push_back(4 * i + b);
  EpLogits out;
  const auto vocab = static_cast<std::size_t>(model.config().vocab_size);
  for (int step = 0; step < steps; ++step) {
    ForwardBatch batch;
    std::vector<int> in_batch;
    for (int i : mine) {
      const EpSeq& s = seqs[static_cast<std::size_t>(i)];
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

// Uneven split over ep ranks: rank r gets the i with (i % (ep + 1)) % ep == r; with 4 ranks rank 2 is idle.
inline std::vector<std::vector<int>> ep_split(int n, int ep) {
  std::vector<std::vector<int>> mine(static_cast<std::size_t>(ep));
  for (int i = 0; i < n; ++i) mine[static_cast<std::size_t>((i % (ep + 1)) % ep)].push_back(i);
  if (ep == 4) {
    for (int i : mine[2]) mine[0].push_back(i);
    mine[2].clear();
  }
  return mine;
}

// Runs body(r) on `n` threads; returns each one's exception message ("" if none).
template <class F>
std::vector<std::string> on_threads(int n, F body) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace kvfleet::test
