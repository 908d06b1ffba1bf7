// Splits template source into text and tags, applying jinja2's whitespace rules as transformers
// configures them (trim_blocks, lstrip_blocks, `-`/`+` markers, one trailing newline dropped), and
// tokenizes the inside of each {{ }} / {% %} tag. Comments disappear; {% raw %} becomes text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvfleet::jinja {

struct Token {
  enum class Kind { Name, String, Int, Float, Op, End };
  Kind kind = Kind::End;
  std::string text;  // name, decoded string literal, or operator
  std::int64_t int_value = 0;
  double float_value = 0;
  int line = 0;
};

struct Piece {
  enum class Kind { Text, Output, Statement };
  Kind kind = Kind::Text;
  std::string text;           // Text only
  std::vector<Token> tokens;  // Output/Statement: the tag's tokens, ending with an End token
  int line = 0;
};

// Throws TemplateError on an unterminated tag, string or comment, or an unexpected character.
std::vector<Piece> lex_template(std::string_view source);

}  // namespace kvfleet::jinja
