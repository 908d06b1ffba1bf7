// Statement execution and expression evaluation. Scoping follows jinja2: a for loop runs each
// iteration in a fresh child scope (a `set` inside it is gone at the next iteration and after the
// loop; namespace() objects are how state escapes), `if` opens no scope, macros get their own scope.
#include "engine/core/chat_template/interpreter.h"

#include "engine/core/chat_template/builtins.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

struct Frame {
  const Frame* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Frame* f = this; f; f = f->parent)
      for (const auto& [k, v] : f->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, x] : vars)
      if (k == name) {
        x = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { Normal, Break, Continue };

// Adds " at line N" to errors that do not carry a position yet.
[[noreturn]] void rethrow_with_line(const TemplateError& e, int line) {
  std::string what = e.what();
  if (what.find(" at line ") != std::string::npos) throw e;
  throw TemplateError(what + " at line " + std::to_string(line));
}

class Interpreter {
 public:
  Flow exec(const Body& body, Frame& f, std::string& out) {
    for (const auto& s : body) {
      Flow flow;
      try {
        flow = exec_stmt(*s, f, out);
      } catch (const TemplateError& err) {
        rethrow_with_line(err, s->line);
      }
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  Value eval(const Expr& e, const Frame& f) {
    try {
      return eval_inner(e, f);
    } catch (const TemplateError& err) {
      rethrow_with_line(err, e.line);
    }
  }

 private:
  Flow exec_stmt(const Stmt& s, Frame& f, std::string& out);
  Flow exec_for(const Stmt& s, Frame& f, std::string& out);
  void assign(const Target& t, Value v, Frame& f);
  Value define_macro(const Stmt& s, const Frame& f);
  Value eval_inner(const Expr& e, const Frame& f);
  CallArgs eval_args(const Expr& e, const Frame& f);
  Value eval_call(const Expr& e, const Frame& f);
  Value eval_binary(const Expr& e, const Frame& f);
  Value eval_compare(const Expr& e, const Frame& f);
  Value eval_dict(const Expr& e, const Frame& f);

  // Bounds macro recursion (a template bug, or a hostile template) well inside the thread's stack.
  static constexpr int kMaxMacroDepth = 100;
  int macro_depth_ = 0;
};

Flow Interpreter::exec_stmt(const Stmt& s, Frame& f, std::string& out) {
  switch (s.kind) {
    case Stmt::Kind::Text: out += s.text; return Flow::Normal;
    case Stmt::Kind::Output: out += eval(*s.expr, f).str(); return Flow::Normal;
    case Stmt::Kind::If:
      for (const auto& [cond, body] : s.branches)
        if (eval(*cond, f).truthy()) return exec(body, f, out);
      return exec(s.else_body, f, out);
    case Stmt::Kind::For: return exec_for(s, f, out);
    case Stmt::Kind::Set: assign(s.target, eval(*s.expr, f), f); return Flow::Normal;
    case Stmt::Kind::SetBlock: {
      std::string captured;
      exec(s.body, f, captured);
      Value v(std::move(captured));
      if (s.filter) {
        Frame tmp{&f, {}};
        tmp.set(" block", std::move(v));
        v = eval(*s.filter, tmp);
      }
      assign(s.target, std::move(v), f);
      return Flow::Normal;
    }
    case Stmt::Kind::Macro: f.set(s.text, define_macro(s, f)); return Flow::Normal;
    case Stmt::Kind::Break: return Flow::Break;
    case Stmt::Kind::Continue: return Flow::Continue;
    case Stmt::Kind::Passthrough: return exec(s.body, f, out);
  }
  return Flow::Normal;
}

Value make_loop(const std::vector<Value>& items, size_t i) {
  const auto n = static_cast<std::int64_t>(items.size()), k = static_cast<std::int64_t>(i);
  Value loop = Value::dict();
  Dict& d = loop.as_dict();
  d.items = {{"index", Value(k + 1)},
             {"index0", Value(k)},
             {"revindex", Value(n - k)},
             {"revindex0", Value(n - k - 1)},
             {"first", Value(k == 0)},
             {"last", Value(k == n - 1)},
             {"length", Value(n)},
             {"depth", Value(1)},
             {"depth0", Value(0)},
             {"previtem", k > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
             {"nextitem", k + 1 < n ? items[i + 1] : Value::undefined("there is no next item")}};
  d.items.emplace_back("cycle", Value::function("cycle", [k](const CallArgs& a) {
    if (a.args.empty()) throw TemplateError("no items for cycling given");
    return a.args[static_cast<size_t>(k) % a.args.size()];
  }));
  return loop;
}

Flow Interpreter::exec_for(const Stmt& s, Frame& f, std::string& out) {
  std::vector<Value> items = eval(*s.expr, f).iterate();
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      Frame tmp{&f, {}};
      assign(s.target, item, tmp);
      if (eval(*s.filter, tmp).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(s.else_body, f, out);
  for (size_t i = 0; i < items.size(); ++i) {
    Frame iter{&f, {}};
    iter.vars.reserve(4);
    assign(s.target, items[i], iter);
    iter.set("loop", make_loop(items, i));
    if (exec(s.body, iter, out) == Flow::Break) break;
  }
  return Flow::Normal;
}

void Interpreter::assign(const Target& t, Value v, Frame& f) {
  if (!t.attribute.empty()) {
    const Value* ns = f.find(t.names[0]);
    if (!ns || !ns->is_dict() || !ns->as_dict().is_namespace)
      throw TemplateError("cannot assign attribute on non-namespace object '" + t.names[0] + "'");
    ns->as_dict().set(t.attribute, std::move(v));
    return;
  }
  if (!t.is_tuple) {
    f.set(t.names[0], std::move(v));
    return;
  }
  std::vector<Value> parts = v.iterate();
  if (parts.size() != t.names.size())
    throw TemplateError(parts.size() > t.names.size() ? "too many values to unpack" : "not enough values to unpack");
  for (size_t i = 0; i < parts.size(); ++i) f.set(t.names[i], std::move(parts[i]));
}

Value Interpreter::define_macro(const Stmt& s, const Frame& f) {
  // The macro's scope hangs off the scope it was defined in, which outlives every call made while
  // rendering (macros cannot leave the render call).
  return Value::function(s.text, [this, &s, &f](const CallArgs& a) {
    if (a.args.size() > s.params.size())
      throw TemplateError("macro '" + s.text + "' takes not more than " + std::to_string(s.params.size()) +
                          " argument(s)");
    Frame local{&f, {}};
    for (size_t i = 0; i < s.params.size(); ++i) {
      const auto& [name, dflt] = s.params[i];
      const Value* given = a.get(i, name);
      local.set(name, given ? *given : dflt ? eval(*dflt, local) : Value::undefined("'" + name + "' is undefined"));
    }
    for (const auto& [k, v] : a.kwargs) {
      bool known = false;
      for (const auto& p : s.params) known = known || p.first == k;
      if (!known) throw TemplateError("macro '" + s.text + "' takes no keyword argument '" + k + "'");
    }
    if (macro_depth_ >= kMaxMacroDepth)
      throw TemplateError("maximum recursion depth exceeded in macro '" + s.text + "'");
    ++macro_depth_;
    std::string out;
    try {
      exec(s.body, local, out);
    } catch (...) {
      --macro_depth_;
      throw;
    }
    --macro_depth_;
    return Value(std::move(out));
  });
}

Value Interpreter::eval_call(const Expr& e, const Frame& f) {
  Value callee = eval(*e.a, f);
  if (callee.is_undefined()) throw_undefined(callee);
  if (!callee.is_callable()) throw TemplateError("'" + callee.type_name() + "' object is not callable");
  return callee.as_callable().fn(eval_args(e, f));
}

Value Interpreter::eval_binary(const Expr& e, const Frame& f) {
  Value a = eval(*e.a, f);
  if (e.name == "and") return a.truthy() ? eval(*e.b, f) : a;  // Python: the deciding operand itself
  if (e.name == "or") return a.truthy() ? a : eval(*e.b, f);
  return binary_op(e.name, a, eval(*e.b, f));
}

Value Interpreter::eval_compare(const Expr& e, const Frame& f) {
  Value left = eval(*e.a, f);
  for (size_t i = 0; i < e.ops.size(); ++i) {  // a < b < c is a < b and b < c
    Value right = eval(*e.args[i], f);
    if (!compare_op(e.ops[i], left, right)) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interpreter::eval_dict(const Expr& e, const Frame& f) {
  Value d = Value::dict();
  for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
    Value key = eval(*e.args[i], f);
    if (!key.is_string()) throw TemplateError("unsupported dict key of type '" + key.type_name() + "'");
    d.as_dict().set(key.as_string(), eval(*e.args[i + 1], f));
  }
  return d;
}

CallArgs Interpreter::eval_args(const Expr& e, const Frame& f) {
  CallArgs a;
  a.args.reserve(e.args.size());
  for (const auto& x : e.args) a.args.push_back(eval(*x, f));
  for (const auto& [k, x] : e.kwargs) a.kwargs.emplace_back(k, eval(*x, f));
  return a;
}

Value Interpreter::eval_inner(const Expr& e, const Frame& f) {
  using K = Expr::Kind;
  auto opt = [&](const ExprPtr& x) { return x ? eval(*x, f) : Value(); };
  switch (e.kind) {
    case K::Literal: return e.value;
    case K::Name: {
      const Value* v = f.find(e.name);
      return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case K::Attr: return get_attr(eval(*e.a, f), e.name);
    case K::Item: return get_item(eval(*e.a, f), eval(*e.b, f));
    case K::Slice: return slice(eval(*e.a, f), opt(e.b), opt(e.c), opt(e.d));
    case K::Call: return eval_call(e, f);
    case K::Filter: {
      Value v = eval(*e.a, f);
      return apply_filter(e.name, v, eval_args(e, f));
    }
    case K::Test: {
      Value v = eval(*e.a, f);
      return Value(apply_test(e.name, v, eval_args(e, f)) != e.negated);
    }
    case K::Neg: return negate(eval(*e.a, f));
    case K::Pos: {
      Value v = eval(*e.a, f);
      if (!v.is_number()) throw TemplateError("bad operand type for unary +: '" + v.type_name() + "'");
      return v;
    }
    case K::Not: return Value(!eval(*e.a, f).truthy());
    case K::Binary: return eval_binary(e, f);
    case K::Compare: return eval_compare(e, f);
    case K::Cond: return eval(*e.a, f).truthy() ? eval(*e.b, f) : opt(e.c);
    case K::ListLit:
    case K::TupleLit: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& x : e.args) items.push_back(eval(*x, f));
      return Value::list(std::move(items), e.kind == K::TupleLit);
    }
    case K::DictLit: return eval_dict(e, f);
  }
  throw TemplateError("unknown expression");
}

}  // namespace

std::string render_template(const Template& t, const Dict& context) {
  Frame globals;
  Dict g;
  add_globals(g);
  globals.vars = std::move(g.items);
  Frame root{&globals, context.items};
  std::string out;
  Interpreter interp;
  try {
    interp.exec(t.body, root, out);
  } catch (const RaisedError& e) {
    throw TemplateError(e.what());
  }
  return out;
}

}  // namespace kvfleet::jinja
