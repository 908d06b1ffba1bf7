#include <numeric>
#include <stdexcept>
#include <thread>

#include "kvfleet/communicator.h"
#include "kvfleet/model_runner.h"

namespace kvfleet {

std::vector<float> all_position_logits_rank(const Model& model, const BackendOptions& backend_options,
                                            std::span<const TokenId> ids, Communicator& comm) {
  auto backend = make_backend(backend_options);
  RunnerOptions ro;
  ro.num_blocks = static_cast<std::int64_t>(ids.size()) / ro.block_size + 1;
  ro.max_batch_tokens = std::max<std::int64_t>(1, static_cast<std::int64_t>(ids.size()));
  ro.ep = &comm;
  ModelRunner runner(model, *backend, ro);
  std::vector<std::int32_t> table(static_cast<std::size_t>(ro.num_blocks));
  std::iota(table.begin(), table.end(), 0);
  ForwardBatch batch;
  batch.chunks.push_back({ids, 0, table, SeqChunk::Logits::all});
  return runner.forward(batch);
}

std::vector<float> all_position_logits_ep(const Model& model, const BackendOptions& backend_options,
                                          std::span<const TokenId> ids, int ep_size) {
  auto comms = make_in_process_group(ep_size);
  std::vector<std::vector<float>> logits(static_cast<std::size_t>(ep_size));
  std::vector<std::string> errors(static_cast<std::size_t>(ep_size));
  auto rank = [&](int r) {
    try {
      logits[static_cast<std::size_t>(r)] = all_position_logits_rank(model, backend_options, ids, *comms[static_cast<std::size_t>(r)]);
    } catch (const std::exception& e) {
      // A rank that fails before its first collective would leave the others waiting: the checks that can
      // fail (ep_size not dividing the experts) run in every rank's constructor alike.
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < ep_size; ++r) threads.emplace_back(rank, r);
  rank(0);
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
  return logits[0];
}

}  // namespace kvfleet
