// Expression parser over one tag's tokens; the statement parser (parser.cpp) drives it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/core/chat_template/ast.h"
#include "engine/core/chat_template/lexer.h"

namespace kvfleet::jinja {

class ExprParser {
 public:
  explicit ExprParser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  ExprPtr parse_tuple(bool with_condexpr);  // a, b, c -> tuple; one expression -> itself
  ExprPtr parse_expression();               // with `x if c else y`
  ExprPtr parse_or();                       // without the conditional (for-loop iterables)
  ExprPtr parse_filters_and_tests(ExprPtr node);

  const Token& peek() const { return tokens_[pos_]; }
  bool at_end() const { return tokens_[pos_].kind == Token::Kind::End; }
  bool at_op(std::string_view op) const;
  bool at_name(std::string_view name) const;
  bool skip_op(std::string_view op);
  bool skip_name(std::string_view name);
  void expect_op(std::string_view op);
  std::string expect_name();
  [[noreturn]] void fail(const std::string& what) const;
  static std::string describe(const Token& t);

 private:
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_binary_level(int level);
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node, int line);
  void parse_call_args(Expr& call);

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
};

}  // namespace kvfleet::jinja
