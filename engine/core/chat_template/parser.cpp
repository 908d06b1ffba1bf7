// Statement parser: turns the lexer's pieces into a tree of if / for / set / macro / output nodes.
#include "engine/core/chat_template/parser.h"

#include <initializer_list>

#include "engine/core/chat_template/lexer.h"
#include "engine/core/chat_template/parser_expr.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

class StmtParser {
 public:
  explicit StmtParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Template run() {
    Template t;
    t.body = parse_body({}, "");
    return t;
  }

 private:
  // Parses until a statement whose tag name is in `ends`; leaves idx_ on it. `opener` names the block
  // for the "missing end tag" error.
  Body parse_body(std::initializer_list<std::string_view> ends, std::string_view opener);
  std::unique_ptr<Stmt> parse_statement(const Piece& piece);
  void parse_if(ExprParser& p, Stmt& s);
  void parse_for(ExprParser& p, Stmt& s);
  void parse_set(ExprParser& p, Stmt& s);
  void parse_macro(ExprParser& p, Stmt& s);
  Target parse_target(ExprParser& p, bool allow_attribute);
  static void expect_end(ExprParser& p) {
    if (!p.at_end()) p.fail("expected end of statement, got " + ExprParser::describe(p.peek()));
  }
  // The tag name of the statement at idx_ (the caller knows it is one).
  const std::string& current_tag() const { return pieces_[idx_].tokens[0].text; }

  std::vector<Piece> pieces_;
  size_t idx_ = 0;
  int loop_depth_ = 0;
};

Body StmtParser::parse_body(std::initializer_list<std::string_view> ends, std::string_view opener) {
  Body body;
  while (idx_ < pieces_.size()) {
    const Piece& piece = pieces_[idx_];
    if (piece.kind == Piece::Kind::Text) {
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::Text;
      s->line = piece.line;
      s->text = piece.text;
      body.push_back(std::move(s));
      ++idx_;
      continue;
    }
    if (piece.kind == Piece::Kind::Output) {
      ExprParser p(piece.tokens);
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::Output;
      s->line = piece.line;
      s->expr = p.parse_tuple(true);
      if (!p.at_end()) p.fail("expected end of print statement, got " + ExprParser::describe(p.peek()));
      body.push_back(std::move(s));
      ++idx_;
      continue;
    }
    if (piece.tokens[0].kind != Token::Kind::Name) ExprParser(piece.tokens).fail("expected a tag name");
    const std::string& tag = piece.tokens[0].text;
    for (auto end : ends)
      if (tag == end) return body;
    body.push_back(parse_statement(piece));
  }
  for (auto end : ends) {
    if (end.rfind("end", 0) == 0)
      throw TemplateError("missing {% " + std::string(end) + " %} for the '" + std::string(opener) +
                          "' tag at end of template");
  }
  return body;
}

std::unique_ptr<Stmt> StmtParser::parse_statement(const Piece& piece) {
  ExprParser p(piece.tokens);
  const std::string tag = p.expect_name();
  auto s = std::make_unique<Stmt>();
  s->line = piece.line;
  ++idx_;
  if (tag == "if") {
    parse_if(p, *s);
  } else if (tag == "for") {
    parse_for(p, *s);
  } else if (tag == "set") {
    parse_set(p, *s);
  } else if (tag == "macro") {
    parse_macro(p, *s);
  } else if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) p.fail("'" + tag + "' outside of a loop");
    expect_end(p);
    s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
  } else if (tag == "generation") {  // transformers' AssistantTracker: renders its body unchanged
    expect_end(p);
    s->kind = Stmt::Kind::Passthrough;
    s->body = parse_body({"endgeneration"}, tag);
    ++idx_;
  } else if (tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else") {
    throw TemplateError("unexpected '" + tag + "' at line " + std::to_string(piece.line));
  } else {
    throw TemplateError("unsupported tag '" + tag + "' at line " + std::to_string(piece.line));
  }
  return s;
}

void StmtParser::parse_if(ExprParser& p, Stmt& s) {
  s.kind = Stmt::Kind::If;
  auto cond = p.parse_tuple(false);
  expect_end(p);
  while (true) {
    Body body = parse_body({"elif", "else", "endif"}, "if");
    s.branches.emplace_back(std::move(cond), std::move(body));
    ExprParser q(pieces_[idx_].tokens);
    const std::string tag = q.expect_name();
    ++idx_;
    if (tag == "elif") {
      cond = q.parse_tuple(false);
      expect_end(q);
      continue;
    }
    expect_end(q);
    if (tag == "else") {
      s.else_body = parse_body({"endif"}, "if");
      ExprParser r(pieces_[idx_].tokens);
      r.expect_name();
      expect_end(r);
      ++idx_;
    }
    return;
  }
}

Target StmtParser::parse_target(ExprParser& p, bool allow_attribute) {
  Target t;
  bool paren = p.skip_op("(");
  t.names.push_back(p.expect_name());
  if (allow_attribute && !paren && p.skip_op(".")) {
    t.attribute = p.expect_name();
    return t;
  }
  while (p.skip_op(",")) {
    t.is_tuple = true;
    if (p.at_name("in") || p.at_op("=") || p.at_op(")")) break;
    t.names.push_back(p.expect_name());
  }
  if (paren) {
    p.expect_op(")");
    t.is_tuple = true;
  }
  return t;
}

void StmtParser::parse_for(ExprParser& p, Stmt& s) {
  s.kind = Stmt::Kind::For;
  s.target = parse_target(p, false);
  if (!p.skip_name("in")) p.fail("expected 'in' in for loop");
  s.expr = p.parse_tuple(false);
  if (p.skip_name("if")) s.filter = p.parse_expression();
  if (p.at_name("recursive")) p.fail("unsupported recursive for loop");
  expect_end(p);
  ++loop_depth_;
  s.body = parse_body({"endfor", "else"}, "for");
  --loop_depth_;
  if (current_tag() == "else") {
    ExprParser q(pieces_[idx_].tokens);
    q.expect_name();
    expect_end(q);
    ++idx_;
    s.else_body = parse_body({"endfor"}, "for");
  }
  ExprParser r(pieces_[idx_].tokens);
  r.expect_name();
  expect_end(r);
  ++idx_;
}

void StmtParser::parse_set(ExprParser& p, Stmt& s) {
  s.target = parse_target(p, true);
  if (p.skip_op("=")) {
    s.kind = Stmt::Kind::Set;
    s.expr = p.parse_tuple(true);
    expect_end(p);
    return;
  }
  s.kind = Stmt::Kind::SetBlock;
  if (s.target.is_tuple || !s.target.attribute.empty()) p.fail("a block set needs a plain name");
  if (p.at_op("|")) {  // the filters apply to the rendered body, bound to a name no template can write
    auto placeholder = std::make_unique<Expr>();
    placeholder->kind = Expr::Kind::Name;
    placeholder->name = " block";
    placeholder->line = p.peek().line;
    s.filter = p.parse_filters_and_tests(std::move(placeholder));
  }
  expect_end(p);
  s.body = parse_body({"endset"}, "set");
  ExprParser r(pieces_[idx_].tokens);
  r.expect_name();
  expect_end(r);
  ++idx_;
}

void StmtParser::parse_macro(ExprParser& p, Stmt& s) {
  s.kind = Stmt::Kind::Macro;
  s.text = p.expect_name();
  p.expect_op("(");
  while (!p.skip_op(")")) {
    if (!s.params.empty()) p.expect_op(",");
    std::string name = p.expect_name();
    ExprPtr def;
    if (p.skip_op("=")) def = p.parse_expression();
    s.params.emplace_back(std::move(name), std::move(def));
  }
  expect_end(p);
  int saved = loop_depth_;
  loop_depth_ = 0;
  s.body = parse_body({"endmacro"}, "macro");
  loop_depth_ = saved;
  ExprParser r(pieces_[idx_].tokens);
  r.expect_name();
  expect_end(r);
  ++idx_;
}

}  // namespace

Template parse_template(std::string_view source) { return StmtParser(lex_template(source)).run(); }

}  // namespace kvfleet::jinja
