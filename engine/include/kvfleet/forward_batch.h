// What one engine step asks the model to compute: plain data, produced by the scheduler and consumed
// by the ModelRunner. Nothing here touches backend memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet {

// One sequence's share of a step: compute `tokens`, which sit at positions
// [start_pos, start_pos + tokens.size()) of the sequence. Their K/V go into the slots that
// `block_table` maps those positions to (position p -> block block_table[p / block_size], offset
// p % block_size); attention reads positions [0, p] through the same table (the earlier ones were
// written by earlier steps or found in the prefix cache).
struct SeqChunk {
  std::span<const TokenId> tokens;
  std::int32_t start_pos = 0;
  std::span<const std::int32_t> block_table;
  // Logits wanted for this chunk: none (a prefill chunk that does not reach the prompt's end), the
  // last token only (the usual case: sample the next token), or every token (`kvfleet logits`).
  enum class Logits : std::uint8_t { none, last, all } logits = Logits::last;
};

struct ForwardBatch {
  std::vector<SeqChunk> chunks;
  std::size_t num_tokens() const {
    std::size_t n = 0;
    for (const auto& c : chunks) n += c.tokens.size();
    return n;
  }
};

}  // namespace kvfleet
