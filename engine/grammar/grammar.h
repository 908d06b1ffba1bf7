// kvfleet's grammar engine: compiles a grammar for one vocabulary into a TokenGrammar
// (kvfleet/token_constraint.h) whose matchers give exact per-token masks for constrained decoding.
//
// What it accepts (GrammarSpec::kind):
// - gbnf: llama.cpp's GBNF: `name ::= ...` rules (the start rule is `root`), alternation `|`, grouping,
//   `* + ? {m} {m,} {m,n}`, "literals" and [character classes] (ranges, `^` negation, escapes \n \t \r
//   \\ \" \] \xHH \uHHHH \UHHHHHHHH), `.` (any character), `#` comments. Left recursion is an error.
// - regex: the whole output matches (anchors ^ $ allowed at the ends only): classes, \d \w \s \D \W \S,
//   escapes, `.`, quantifiers incl. {m,n} and lazy forms (the same language), groups, (?:), alternation.
// - choice: the output is exactly one of `choices`.
// - json_schema: a JSON Schema (drafts 4 to 2020-12 keywords): type (and lists of types), properties,
//   required, additionalProperties (bool or schema), items/prefixItems (and draft-4 items arrays with
//   additionalItems), enum/const, anyOf, oneOf (branches that cannot overlap: different types or a
//   required property with different constant values), allOf (merged when the subschemas do not share a
//   keyword; keywords next to anyOf/oneOf apply to every branch), $ref/$defs/definitions (JSON pointers into the document, recursion included),
//   minLength/maxLength, minItems/maxItems, minimum/maximum/exclusive* (integer-valued bounds),
//   pattern (not together with min/maxLength), format date/time/date-time/email/uuid/uri.
//   Annotations (title, description, examples, default, $comment, ...) are ignored; every other keyword
//   is a GrammarError naming it and its schema path. Properties come in the schema's order; properties
//   not listed are allowed only when additionalProperties says so (true or a schema; an absent
//   additionalProperties is taken as false unless GrammarOptions::strict_objects is off).
// - json_object: any JSON object.
// Whitespace (JSON kinds): compact JSON plus optional whitespace ([ \t\n\r], at most
// GrammarOptions::whitespace_bound bytes in a row) between tokens, so a model cannot loop on spaces.
// Numbers are JSON numbers; strings are JSON strings of valid UTF-8 whose escapes are \" \\ \/ \b \f \n
// \r \t \uXXXX; a bounded length counts characters (an escape is one).
//
// Tokens: a token is allowed when its bytes (tokenizer decoder bytes: byte-level BPE and SentencePiece
// alike) keep the output a prefix of a string of the language; special tokens never, except the stop
// tokens given to the Vocabulary, which are allowed exactly where the grammar may end. A token with no
// bytes is never allowed.
//
// Bounds: a grammar whose automaton would exceed GrammarOptions::max_states, or whose compile takes
// longer than GrammarOptions::compile_budget, is a GrammarError (the API's 400), never a stuck engine.
//
// Thread-safety: a Vocabulary and a compiled TokenGrammar are immutable to their users and may be
// shared by any threads (a grammar fills its per-position mask table lazily under its own lock); a
// TokenMatcher is used by one thread at a time. GrammarCache is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kvfleet/token_constraint.h"

namespace kvfleet {
class Tokenizer;
}

namespace kvfleet::grammar {

// Every problem with a grammar: the message, and for JSON Schema the JSON pointer of the offending
// schema and the keyword ("#/properties/age", "multipleOf"); empty for other kinds.
class GrammarError : public std::runtime_error {
 public:
  explicit GrammarError(const std::string& message, std::string schema_path = {}, std::string keyword = {});
  const std::string& schema_path() const { return schema_path_; }
  const std::string& keyword() const { return keyword_; }

 private:
  std::string schema_path_;
  std::string keyword_;
};

enum class GrammarKind { gbnf, regex, choice, json_schema, json_object };

struct GrammarSpec {
  GrammarKind kind = GrammarKind::json_object;
  std::string text;                  // gbnf, regex, json_schema (the schema as JSON text)
  std::vector<std::string> choices;  // choice
};

struct GrammarOptions {
  std::size_t whitespace_bound = 20;
  bool strict_objects = true;  // an absent additionalProperties means false
  std::size_t max_states = 200000;
  std::chrono::milliseconds compile_budget{2000};
};

class Vocabulary;

// Compiles `spec` for `vocab`. Throws GrammarError.
std::shared_ptr<const TokenGrammar> compile(const GrammarSpec& spec, std::shared_ptr<const Vocabulary> vocab,
                                            const GrammarOptions& options = {});

// The byte-level language of `spec`, without a vocabulary: for tests and tools.
class ByteMatcher {
 public:
  virtual ~ByteMatcher() = default;
  virtual bool feed(std::string_view bytes) = 0;  // false (and no change) if it leaves the language
  virtual bool can_end() const = 0;               // the bytes so far are a whole string of the language
};
std::unique_ptr<ByteMatcher> compile_bytes(const GrammarSpec& spec, const GrammarOptions& options = {});

}  // namespace kvfleet::grammar
