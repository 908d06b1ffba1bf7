// Expression grammar (jinja2's parser.py, same precedence from loosest to tightest):
//   tuple: expr (',' expr)*          expr: or ('if' or ('else' expr)?)*
//   or / and / not / compare (== != < <= > >= in, not in) / + - / ~ / * / // % / ** / unary - +
//   unary then postfix (.attr [sub] (call)) then filters (| f) and tests (is t), which bind tightest.
#include "engine/core/chat_template/parser_expr.h"

#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {

namespace {
ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}
}  // namespace

[[noreturn]] void ExprParser::fail(const std::string& what) const {
  throw TemplateError(what + " at line " + std::to_string(peek().line));
}

bool ExprParser::at_op(std::string_view op) const { return peek().kind == Token::Kind::Op && peek().text == op; }
bool ExprParser::at_name(std::string_view name) const {
  return peek().kind == Token::Kind::Name && peek().text == name;
}
bool ExprParser::skip_op(std::string_view op) {
  if (!at_op(op)) return false;
  ++pos_;
  return true;
}
bool ExprParser::skip_name(std::string_view name) {
  if (!at_name(name)) return false;
  ++pos_;
  return true;
}
void ExprParser::expect_op(std::string_view op) {
  if (!skip_op(op)) fail("expected '" + std::string(op) + "', got " + describe(peek()));
}
std::string ExprParser::expect_name() {
  if (peek().kind != Token::Kind::Name) fail("expected a name, got " + describe(peek()));
  return tokens_[pos_++].text;
}
std::string ExprParser::describe(const Token& t) {
  if (t.kind == Token::Kind::End) return "end of tag";
  if (t.kind == Token::Kind::String) return "string";
  return "'" + t.text + "'";
}

ExprPtr ExprParser::parse_tuple(bool with_condexpr) {
  int line = peek().line;
  auto first = with_condexpr ? parse_expression() : parse_or();
  if (!at_op(",")) return first;
  auto tuple = make(Expr::Kind::TupleLit, line);
  tuple->args.push_back(std::move(first));
  while (skip_op(",")) {
    if (at_end() || at_op(")") || at_name("if")) break;  // trailing comma
    tuple->args.push_back(with_condexpr ? parse_expression() : parse_or());
  }
  return tuple;
}

ExprPtr ExprParser::parse_expression() {
  auto expr = parse_or();
  while (at_name("if")) {
    int line = peek().line;
    ++pos_;
    auto cond = make(Expr::Kind::Cond, line);
    cond->a = parse_or();
    cond->b = std::move(expr);
    if (skip_name("else")) cond->c = parse_expression();
    expr = std::move(cond);
  }
  return expr;
}

ExprPtr ExprParser::parse_or() {
  auto left = parse_and();
  while (at_name("or")) {
    auto e = make(Expr::Kind::Binary, peek().line);
    ++pos_;
    e->name = "or";
    e->a = std::move(left);
    e->b = parse_and();
    left = std::move(e);
  }
  return left;
}

ExprPtr ExprParser::parse_and() {
  auto left = parse_not();
  while (at_name("and")) {
    auto e = make(Expr::Kind::Binary, peek().line);
    ++pos_;
    e->name = "and";
    e->a = std::move(left);
    e->b = parse_not();
    left = std::move(e);
  }
  return left;
}

ExprPtr ExprParser::parse_not() {
  if (at_name("not")) {
    auto e = make(Expr::Kind::Not, peek().line);
    ++pos_;
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}

ExprPtr ExprParser::parse_compare() {
  int line = peek().line;
  auto first = parse_math1();
  ExprPtr cmp;
  while (true) {
    std::string op;
    if (peek().kind == Token::Kind::Op &&
        (at_op("==") || at_op("!=") || at_op("<") || at_op("<=") || at_op(">") || at_op(">="))) {
      op = tokens_[pos_++].text;
    } else if (skip_name("in")) {
      op = "in";
    } else if (at_name("not") && pos_ + 1 < tokens_.size() && tokens_[pos_ + 1].kind == Token::Kind::Name &&
               tokens_[pos_ + 1].text == "in") {
      pos_ += 2;
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = make(Expr::Kind::Compare, line);
      cmp->a = std::move(first);
    }
    cmp->ops.push_back(op);
    cmp->args.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(first);
}

ExprPtr ExprParser::parse_binary_level(int level) {
  // levels: 0: + -   1: ~   2: * / // %   3: **
  static const std::vector<std::vector<std::string_view>> ops = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
  auto next = [&]() { return level == 3 ? parse_unary(true) : parse_binary_level(level + 1); };
  auto left = next();
  while (true) {
    std::string_view found;
    for (auto op : ops[static_cast<size_t>(level)])
      if (at_op(op)) found = op;
    if (found.empty()) return left;
    auto e = make(Expr::Kind::Binary, peek().line);
    ++pos_;
    e->name = std::string(found);
    e->a = std::move(left);
    e->b = next();
    left = std::move(e);
  }
}

ExprPtr ExprParser::parse_math1() { return parse_binary_level(0); }

ExprPtr ExprParser::parse_unary(bool with_filter) {
  ExprPtr node;
  if (at_op("-") || at_op("+")) {
    node = make(at_op("-") ? Expr::Kind::Neg : Expr::Kind::Pos, peek().line);
    ++pos_;
    node->a = parse_unary(false);
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filters_and_tests(std::move(node));
  return node;
}

ExprPtr ExprParser::parse_primary() {
  const Token& t = peek();
  auto lit = [&](Value v) {
    auto e = make(Expr::Kind::Literal, t.line);
    e->value = std::move(v);
    ++pos_;
    return e;
  };
  switch (t.kind) {
    case Token::Kind::Name:
      if (t.text == "true" || t.text == "True") return lit(Value(true));
      if (t.text == "false" || t.text == "False") return lit(Value(false));
      if (t.text == "none" || t.text == "None") return lit(Value(None{}));
      {
        auto e = make(Expr::Kind::Name, t.line);
        e->name = t.text;
        ++pos_;
        return e;
      }
    case Token::Kind::String: {
      std::string s = t.text;
      int line = t.line;
      ++pos_;
      while (peek().kind == Token::Kind::String) s += tokens_[pos_++].text;  // adjacent literals concatenate
      auto e = make(Expr::Kind::Literal, line);
      e->value = Value(std::move(s));
      return e;
    }
    case Token::Kind::Int: return lit(Value(t.int_value));
    case Token::Kind::Float: return lit(Value(t.float_value));
    case Token::Kind::End: fail("unexpected end of tag");
    case Token::Kind::Op: break;
  }
  if (skip_op("(")) {
    if (skip_op(")")) return make(Expr::Kind::TupleLit, t.line);
    auto inner = parse_tuple(true);
    expect_op(")");
    return inner;
  }
  if (at_op("[")) return parse_list();
  if (at_op("{")) return parse_dict();
  fail("unexpected " + describe(t));
}

ExprPtr ExprParser::parse_list() {
  auto e = make(Expr::Kind::ListLit, peek().line);
  expect_op("[");
  while (!skip_op("]")) {
    if (!e->args.empty()) {
      expect_op(",");
      if (skip_op("]")) break;
    }
    e->args.push_back(parse_expression());
  }
  return e;
}

ExprPtr ExprParser::parse_dict() {
  auto e = make(Expr::Kind::DictLit, peek().line);
  expect_op("{");
  while (!skip_op("}")) {
    if (!e->args.empty()) {
      expect_op(",");
      if (skip_op("}")) break;
    }
    e->args.push_back(parse_expression());
    expect_op(":");
    e->args.push_back(parse_expression());
  }
  return e;
}

ExprPtr ExprParser::parse_postfix(ExprPtr node) {
  while (true) {
    int line = peek().line;
    if (skip_op(".")) {
      if (peek().kind == Token::Kind::Int) {
        auto e = make(Expr::Kind::Item, line);
        e->a = std::move(node);
        e->b = make(Expr::Kind::Literal, line);
        e->b->value = Value(tokens_[pos_++].int_value);
        node = std::move(e);
        continue;
      }
      auto e = make(Expr::Kind::Attr, line);
      e->a = std::move(node);
      e->name = expect_name();
      node = std::move(e);
    } else if (skip_op("[")) {
      node = parse_subscript(std::move(node), line);
    } else if (at_op("(")) {
      auto e = make(Expr::Kind::Call, line);
      e->a = std::move(node);
      parse_call_args(*e);
      node = std::move(e);
    } else {
      return node;
    }
  }
}

ExprPtr ExprParser::parse_subscript(ExprPtr node, int line) {
  ExprPtr parts[3];
  bool is_slice = false;
  if (!at_op(":")) parts[0] = parse_expression();
  if (skip_op(":")) {
    is_slice = true;
    if (!at_op("]") && !at_op(":")) parts[1] = parse_expression();
    if (skip_op(":") && !at_op("]")) parts[2] = parse_expression();
  }
  expect_op("]");
  auto e = make(is_slice ? Expr::Kind::Slice : Expr::Kind::Item, line);
  e->a = std::move(node);
  e->b = std::move(parts[0]);
  e->c = std::move(parts[1]);
  e->d = std::move(parts[2]);
  return e;
}

void ExprParser::parse_call_args(Expr& call) {
  expect_op("(");
  while (!skip_op(")")) {
    if (!call.args.empty() || !call.kwargs.empty()) {
      expect_op(",");
      if (skip_op(")")) break;
    }
    if (at_op("*") || at_op("**")) fail("unsupported '*args' / '**kwargs' in call");
    if (peek().kind == Token::Kind::Name && pos_ + 1 < tokens_.size() && tokens_[pos_ + 1].kind == Token::Kind::Op &&
        tokens_[pos_ + 1].text == "=") {
      std::string key = tokens_[pos_].text;
      pos_ += 2;
      call.kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (!call.kwargs.empty()) fail("positional argument after keyword argument");
      call.args.push_back(parse_expression());
    }
  }
}

ExprPtr ExprParser::parse_filters_and_tests(ExprPtr node) {
  while (true) {
    int line = peek().line;
    if (skip_op("|")) {
      auto e = make(Expr::Kind::Filter, line);
      e->a = std::move(node);
      e->name = expect_name();
      if (at_op("(")) parse_call_args(*e);
      node = std::move(e);
    } else if (skip_name("is")) {
      auto e = make(Expr::Kind::Test, line);
      e->a = std::move(node);
      e->negated = skip_name("not");
      e->name = expect_name();
      const Token& t = peek();
      if (at_op("(")) {
        parse_call_args(*e);
      } else if ((t.kind == Token::Kind::Name || t.kind == Token::Kind::String || t.kind == Token::Kind::Int ||
                  t.kind == Token::Kind::Float || at_op("[") || at_op("{")) &&
                 !at_name("else") && !at_name("or") && !at_name("and")) {
        if (at_name("is")) fail("cannot chain multiple tests with 'is'");
        e->args.push_back(parse_postfix(parse_primary()));
      }
      node = std::move(e);
    } else if (at_op("(")) {
      auto e = make(Expr::Kind::Call, line);
      e->a = std::move(node);
      parse_call_args(*e);
      node = std::move(e);
    } else {
      return node;
    }
  }
}

}  // namespace kvfleet::jinja
