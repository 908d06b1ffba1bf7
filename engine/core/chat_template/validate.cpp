// Load-time check that every filter and test a template names exists, so an unsupported one is
// reported when the model loads ("unsupported filter 'xmlattr' at line 3"), not on some later request.
#include "engine/core/chat_template/builtins.h"
#include "engine/core/chat_template/interpreter.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

void check_expr(const Expr* e) {
  if (!e) return;
  if (e->kind == Expr::Kind::Filter && !has_filter(e->name))
    throw TemplateError("unsupported filter '" + e->name + "' at line " + std::to_string(e->line));
  if (e->kind == Expr::Kind::Test && !has_test(e->name))
    throw TemplateError("unsupported test '" + e->name + "' at line " + std::to_string(e->line));
  for (const Expr* x : {e->a.get(), e->b.get(), e->c.get(), e->d.get()}) check_expr(x);
  for (const auto& x : e->args) check_expr(x.get());
  for (const auto& kv : e->kwargs) check_expr(kv.second.get());
}

void check_body(const Body& body) {
  for (const auto& s : body) {
    check_expr(s->expr.get());
    check_expr(s->filter.get());
    for (const auto& [cond, b] : s->branches) {
      check_expr(cond.get());
      check_body(b);
    }
    for (const auto& p : s->params) check_expr(p.second.get());
    check_body(s->body);
    check_body(s->else_body);
  }
}

}  // namespace

void validate_template(const Template& t) { check_body(t.body); }

}  // namespace kvfleet::jinja
