#include "kvfleet/perplexity.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kvfleet/model_runner.h"

namespace kvfleet {

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

PerplexityResult window_perplexity(const Model& model, Backend& backend, std::span<const TokenId> ids,
                                   std::int64_t context) {
  if (context < 2) throw std::invalid_argument("perplexity: context must be at least 2, got " + std::to_string(context));
  const auto vocab = static_cast<std::size_t>(model.config().vocab_size);
  for (TokenId id : ids)
    if (id < 0 || static_cast<std::size_t>(id) >= vocab)
      throw std::invalid_argument("perplexity: token id " + std::to_string(id) + " is outside the vocabulary");
  PerplexityResult result;
  const auto window = static_cast<std::size_t>(context);
  for (std::size_t start = 0; start < ids.size(); start += window) {
    const auto w = ids.subspan(start, std::min(window, ids.size() - start));
    if (w.size() < 2) continue;
    const auto logits = all_position_logits(model, backend, w);
    for (std::size_t r = 0; r + 1 < w.size(); ++r) {
      const float* row = logits.data() + r * vocab;
      const double max = *std::max_element(row, row + vocab);
      double sum = 0.0;
      for (std::size_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
      const double logp = static_cast<double>(row[static_cast<std::size_t>(w[r + 1])]) - max - std::log(sum);
      result.nll_sum -= logp;
    }
    result.tokens_scored += static_cast<std::int64_t>(w.size() - 1);
    ++result.windows;
  }
  return result;
}

}  // namespace kvfleet
