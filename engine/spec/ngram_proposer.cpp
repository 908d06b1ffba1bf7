#include <algorithm>
#include <stdexcept>

#include "engine/spec/proposer.h"
#include "engine/spec/suffix_proposer.h"

namespace kvfleet::spec {

void NgramProposer::propose(std::span<const TokenId> tokens, std::int32_t k, std::vector<TokenId>& out) {
  out.clear();
  const auto len = static_cast<std::int64_t>(tokens.size());
  if (k <= 0) return;
  for (std::int64_t n = std::min<std::int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const std::span<const TokenId> tail = tokens.subspan(static_cast<std::size_t>(len - n));
    // Earliest start i with tokens[i, i + n) == tail, the tail itself excluded (i + n < len).
    for (std::int64_t i = 0; i + n < len; ++i) {
      if (tokens[static_cast<std::size_t>(i)] != tail[0]) continue;
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + i)) continue;
      const std::int64_t from = i + n, to = std::min(len, from + k);
      out.assign(tokens.begin() + from, tokens.begin() + to);
      return;
    }
  }
}

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config) {
  if (config.method == "suffix") return std::make_unique<SuffixProposer>(config);
  if (config.method == "draft_model")
    throw std::invalid_argument("speculative_config: method \"draft_model\" is made with the target's settings (DraftModelProposer)");
  return std::make_unique<NgramProposer>(config.prompt_lookup_min, config.prompt_lookup_max);
}

}  // namespace kvfleet::spec
