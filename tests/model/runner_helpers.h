// Runs a model over token sequences with the CPU backend, for the model tests.
#pragma once

#include <vector>

#include "kvfleet/model_runner.h"

namespace kvfleet::test {

// Logits of every position of `ids`, computed in one step.
inline std::vector<float> all_logits(const Model& model, const std::vector<TokenId>& ids, unsigned threads = 2,
                                     DType kv_dtype = DType::f32) {
  auto backend = make_cpu_backend(threads, kv_dtype);
  return all_position_logits(model, *backend, ids);
}

}  // namespace kvfleet::test
