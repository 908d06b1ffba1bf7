// The parsed template. Immutable after parsing, so one tree serves concurrent renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/chat_template/value.h"

namespace kvfleet::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // value
    Name,       // name
    Attr,       // a.name
    Item,       // a[b]
    Slice,      // a[b:c:d]; absent parts are null
    Call,       // a(args, kwargs)
    Filter,     // a | name(args, kwargs)
    Test,       // a is [not] name(args)
    Neg, Pos, Not,
    Binary,     // a op b: + - * / // % ** ~ and or
    Compare,    // a op b op c ...: == != < <= > >= in notin
    Cond,       // b if a else c
    ListLit, TupleLit, DictLit,
  };
  Kind kind;
  int line = 0;
  Value value;                    // Literal
  std::string name;               // Name, Attr, Filter, Test; the operator of Binary
  ExprPtr a, b, c, d;             // operands (see Kind)
  std::vector<ExprPtr> args;      // Call/Filter/Test arguments; list/tuple items; dict keys, values interleaved
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;   // Compare operators, one per args element
  bool negated = false;           // Test
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

// An assignment target: a name, a tuple of names, or namespace.attribute.
struct Target {
  std::vector<std::string> names;  // one name, or several for tuple unpacking
  std::string attribute;           // `set ns.attr = ...`: names[0] is ns
  bool is_tuple = false;
};

struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Passthrough };
  Kind kind;
  int line = 0;
  std::string text;                              // Text; Macro name
  ExprPtr expr;                                  // Output, Set value, For iterable
  ExprPtr filter;                                // For `if` filter; SetBlock filter chain (applied to a placeholder)
  Target target;                                 // Set, SetBlock, For
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body) for if and each elif
  Body body;                                     // For, SetBlock, Macro, Passthrough
  Body else_body;                                // If, For
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro parameters with optional defaults
};

struct Template {
  Body body;
};

}  // namespace kvfleet::jinja
