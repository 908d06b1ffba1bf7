// apply_token_mask (kvfleet/sampler.h): a grammar's allowed-token bitmask onto a row of logits.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvfleet/sampler.h"

namespace kvfleet {

bool apply_token_mask(std::span<float> logits, std::span<const std::uint32_t> mask) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const std::size_t n = logits.size();
  const std::size_t covered = std::min(n, mask.size() * 32);
  bool any = false;
  // Word by word: an all-ones word (most of a permissive mask) leaves its 32 logits alone, an all-zeros word
  // (most of a strict one) clears them without testing bits.
  for (std::size_t w = 0; w * 32 < covered; ++w) {
    const std::uint32_t bits = mask[w];
    const std::size_t begin = w * 32, end = std::min(covered, begin + 32);
    if (bits == 0) {
      std::fill(logits.begin() + static_cast<std::ptrdiff_t>(begin), logits.begin() + static_cast<std::ptrdiff_t>(end),
                kMasked);
      continue;
    }
    for (std::size_t i = begin; i < end; ++i) {
      if ((bits >> (i - begin)) & 1u) any = any || std::isfinite(logits[i]);
      else logits[i] = kMasked;
    }
  }
  std::fill(logits.begin() + static_cast<std::ptrdiff_t>(covered), logits.end(), kMasked);
  return any;
}

}  // namespace kvfleet
