// Perplexity of a token sequence under a model: what `kvfleet perplexity` prints and what the default
// model's tests compare against PyTorch (scripts/default_model/llama.py window_nll).
//
// The ids are cut into consecutive, non-overlapping windows of `context` tokens (the last may be
// shorter). Each window is run on its own from position 0; every token but the window's first is scored
// by the log-softmax (in double) of the logits at the position before it. A window of one token scores
// nothing. Thread-safety: a pure function of its arguments; the backend is used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>

#include "kvfleet/backend.h"
#include "kvfleet/model.h"

namespace kvfleet {

struct PerplexityResult {
  double nll_sum = 0.0;           // sum over scored tokens of -log p(token | window prefix), in nats
  std::int64_t tokens_scored = 0;
  std::int64_t windows = 0;
  double mean_nll() const { return tokens_scored ? nll_sum / static_cast<double>(tokens_scored) : 0.0; }
  double perplexity() const;      // exp(mean_nll())
};

// Throws std::invalid_argument when context < 2 or an id is outside the vocabulary.
PerplexityResult window_perplexity(const Model& model, Backend& backend, std::span<const TokenId> ids,
                                   std::int64_t context);

}  // namespace kvfleet
