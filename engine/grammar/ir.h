// The grammar IR every front end produces: named rules, each an expression over byte sets, sequences,
// alternations, bounded/unbounded repetition and references to rules. Text is UTF-8 bytes; a character
// class becomes the byte sequences of its code points (utf8_ranges).
#pragma once

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvfleet::grammar {

using ByteSet = std::bitset<256>;
constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();
constexpr char32_t kMaxCodePoint = 0x10FFFF;

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind { bytes, seq, alt, repeat, ref };
  Kind kind = Kind::seq;
  ByteSet bytes;               // bytes
  std::vector<ExprPtr> items;  // seq, alt; repeat: items[0]
  std::size_t min = 0;         // repeat
  std::size_t max = 0;         // repeat (kUnbounded: no bound)
  int rule = -1;               // ref
};

ExprPtr bytes(const ByteSet& set);
ExprPtr byte_range(unsigned char lo, unsigned char hi);
ExprPtr literal(std::string_view text);
ExprPtr seq(std::vector<ExprPtr> items);
ExprPtr alt(std::vector<ExprPtr> items);
ExprPtr repeat(ExprPtr item, std::size_t min, std::size_t max);
ExprPtr optional(ExprPtr item);
ExprPtr ref(int rule);
ExprPtr empty();

// Code point ranges (inclusive, any order, may overlap); surrogates are never included.
using CodeRanges = std::vector<std::pair<char32_t, char32_t>>;
CodeRanges normalize(CodeRanges ranges);
CodeRanges complement(const CodeRanges& ranges);  // within [0, 0x10FFFF]
// The UTF-8 encodings of exactly the code points in `ranges`.
ExprPtr utf8_ranges(const CodeRanges& ranges);
void append_utf8(std::string& out, char32_t cp);

struct Grammar {
  std::vector<std::string> names;
  std::vector<ExprPtr> rules;  // null until defined
  int root = 0;

  int add_rule(std::string name) {
    names.push_back(std::move(name));
    rules.push_back(nullptr);
    return static_cast<int>(rules.size()) - 1;
  }
};

// Replaces each reference to a rule that cannot reach itself and whose expansion is at most
// `max_nodes` automaton nodes by a copy of its expression (xgrammar's rule inlining): the language is
// the same, but a position inside a small rule (a JSON string's character, whitespace) becomes a
// position of its caller, so the tokens that run past the small rule's end are decided at compile
// time instead of from the whole stack at every step.
void inline_small_rules(Grammar& grammar, std::size_t max_nodes);
// What compile() inlines: whitespace, a JSON string's character, short literals; larger rules stay
// calls so the automaton stays small.
constexpr std::size_t kInlineNodes = 64;

}  // namespace kvfleet::grammar
