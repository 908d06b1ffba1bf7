// Runs a model over token sequences with the CPU backend, for the model tests.
#pragma once

#include <numeric>
#include <vector>

#include "kvfleet/model_runner.h"

namespace kvfleet::test {

// Logits of every position of `ids`, computed in one step.
inline std::vector<float> all_logits(const Model& model, const std::vector<TokenId>& ids, unsigned threads = 2) {
  auto backend = make_cpu_backend(threads);
  RunnerOptions ro;
  ro.num_blocks = static_cast<std::int64_t>(ids.size()) / ro.block_size + 1;
  ro.max_batch_tokens = static_cast<std::int64_t>(ids.size());
  ModelRunner runner(model, *backend, ro);
  std::vector<std::int32_t> table(static_cast<std::size_t>(ro.num_blocks));
  std::iota(table.begin(), table.end(), 0);
  ForwardBatch batch;
  batch.chunks.push_back({ids, 0, table, SeqChunk::Logits::all});
  return runner.forward(batch);
}

}  // namespace kvfleet::test
