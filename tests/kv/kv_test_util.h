// Small factories shared by the KV tests.
#pragma once

#include <numeric>
#include <vector>

#include "kvfleet/sequence.h"

namespace kvfleet::test {

inline std::vector<TokenId> iota_tokens(int n, TokenId first = 0) {
  std::vector<TokenId> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline Sequence make_seq(SeqId id, std::vector<TokenId> tokens) {
  Sequence s;
  s.id = id;
  s.arrival = id;
  s.num_prompt_tokens = static_cast<std::int32_t>(tokens.size());
  s.tokens = std::move(tokens);
  return s;
}

}  // namespace kvfleet::test
