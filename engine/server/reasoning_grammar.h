// Structured outputs after the reasoning, as vLLM applies them with a reasoning parser: the grammar
// constrains only what follows the reasoning section, so that a reasoning model thinks freely, then answers
// in the requested shape (a JSON schema, a forced tool call, ...).
//
// The reasoning section is told by the tokens that open and close it (`<think>`, `</think>`: single tokens
// in the models that reason this way). Starting outside (qwen3): the first token may open the reasoning
// (besides whatever the grammar allows); else the grammar applies from the start. Starting inside
// (deepseek_r1): everything is free up to the closing token. After the closing token the grammar applies.
// The matcher rolls back across the boundary (speculative decoding).
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "kvfleet/token_constraint.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet::server {

struct ReasoningTokens {
  std::optional<TokenId> open;  // outside: the token that may open the reasoning as the first token
  TokenId close = 0;
  bool starts_inside = false;
};

std::shared_ptr<const TokenGrammar> after_reasoning(std::shared_ptr<const TokenGrammar> inner, ReasoningTokens tokens);

// The tokens of the reasoning parser called `parser` (qwen3: starts outside, `<think>` opens; deepseek_r1:
// starts inside) in this vocabulary; none when `<think>` / `</think>` are not single tokens of it.
std::optional<ReasoningTokens> reasoning_tokens(std::string_view parser, const Tokenizer& tokenizer);

}  // namespace kvfleet::server
