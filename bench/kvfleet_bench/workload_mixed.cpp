#include "bench/kvfleet_bench/workload_mixed.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvfleet::bench {
namespace {

std::int32_t draw(std::int32_t mean, double range_ratio, std::mt19937_64& rng) {
  if (range_ratio <= 0) return mean;
  const auto lo = static_cast<std::int32_t>(std::floor(mean * (1 - range_ratio)));
  const auto hi = static_cast<std::int32_t>(std::ceil(mean * (1 + range_ratio)));
  return std::uniform_int_distribution<std::int32_t>(std::max(1, lo), std::max(1, hi))(rng);
}

}  // namespace

Workload mixed_chat_workload(const WorkloadOptions& o, const PromptBuilder& p, std::mt19937_64& rng) {
  if (o.mixed_long_fraction < 0 || o.mixed_long_fraction > 1)
    throw std::invalid_argument("--mixed-long-fraction must be in [0, 1]");
  if (o.mixed_short_input_len < 1 || o.mixed_long_input_len < 1)
    throw std::invalid_argument("--mixed-short-input-len and --mixed-long-input-len must be positive");
  // Exactly round(n * fraction) long prompts, shuffled in: the same count for every seed.
  const std::size_t n = o.num_prompts;
  const auto longs = static_cast<std::size_t>(std::llround(static_cast<double>(n) * o.mixed_long_fraction));
  std::vector<bool> is_long(n, false);
  std::fill(is_long.begin(), is_long.begin() + static_cast<std::ptrdiff_t>(longs), true);
  std::shuffle(is_long.begin(), is_long.end(), rng);
  Workload w{"mixed-chat", {}};
  for (std::size_t i = 0; i < n; ++i) {
    Chain c;
    c.group = is_long[i] ? kLongPromptGroup : kShortChatGroup;
    Turn t;
    t.user_tokens = draw(is_long[i] ? o.mixed_long_input_len : o.mixed_short_input_len, o.random_range_ratio, rng);
    t.output_len = draw(o.random_output_len, o.random_range_ratio, rng);
    t.user_text = p.text(t.user_tokens, rng);
    c.turns.push_back(std::move(t));
    w.chains.push_back(std::move(c));
  }
  return w;
}

void add_mixed_chat_flags(CLI::App& app, WorkloadOptions& w) {
  app.add_option("--mixed-short-input-len", w.mixed_short_input_len, "mixed-chat: prompt tokens of a chat turn");
  app.add_option("--mixed-long-input-len", w.mixed_long_input_len, "mixed-chat: prompt tokens of a long prompt");
  app.add_option("--mixed-long-fraction", w.mixed_long_fraction, "mixed-chat: share of long prompts (0..1)");
}

}  // namespace kvfleet::bench
