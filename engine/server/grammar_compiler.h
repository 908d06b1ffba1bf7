// The replica's grammar compiler: a request's structured-output constraint (api/structured_output.h) compiled by
// the grammar engine (engine/grammar/grammar.h) over the served model's vocabulary, compiled grammars cached.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/server/api/structured_output.h"
#include "kvfleet/block_hash.h"

namespace kvfleet {
class Tokenizer;
}

namespace kvfleet::server {

// `tokenizer` must outlive the compiler. The vocabulary (every token's bytes) is built on the first call; its
// stop tokens are `eos_ids`, and ids at or past `model_vocab` are never allowed. A GrammarError becomes a
// StructuredOutputError whose param names the schema keyword below the request's field.
GrammarCompiler make_grammar_compiler(const Tokenizer& tokenizer, std::vector<TokenId> eos_ids,
                                      std::int64_t model_vocab);

}  // namespace kvfleet::server
