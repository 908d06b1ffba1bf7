#include <algorithm>

#include "kvfleet/engine.h"

namespace kvfleet {

void MoeLoadStats::add_step(const std::vector<std::int32_t>& counts, std::int64_t num_experts, std::int64_t first,
                            std::int64_t held) {
  if (counts.empty() || num_experts <= 0) return;
  const auto e = static_cast<std::size_t>(num_experts);
  if (held <= 0) first = 0, held = num_experts;
  expert_tokens.resize(e, 0);
  std::vector<std::uint64_t> step(e, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) step[i % e] += static_cast<std::uint64_t>(counts[i]);
  for (std::size_t i = 0; i < e; ++i) expert_tokens[i] += step[i];
  const auto begin = step.begin() + first, end = begin + held;
  std::uint64_t total = 0;
  for (auto it = begin; it != end; ++it) total += *it;
  if (total == 0) return;
  const double mean = static_cast<double>(total) / static_cast<double>(held);
  last_imbalance = static_cast<double>(*std::max_element(begin, end)) / mean;
  imbalance_sum += last_imbalance;
  ++steps;
}

}  // namespace kvfleet
