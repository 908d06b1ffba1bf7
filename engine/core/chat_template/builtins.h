// What the interpreter calls into: operators, attribute/item access, filters, tests, methods and
// globals, each with Python/jinja2 semantics. All throw TemplateError (without a line number; the
// interpreter adds it).
#pragma once

#include <string>
#include <string_view>

#include "engine/core/chat_template/value.h"

namespace kvfleet::jinja {

// raise_exception(msg): carries the template's message unchanged (no line number is added).
struct RaisedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws for using an undefined value ("'x' is undefined").
[[noreturn]] void throw_undefined(const Value& v);

// operators.cpp
Value binary_op(std::string_view op, const Value& a, const Value& b);  // + - * / // % ** ~
bool compare_op(std::string_view op, const Value& a, const Value& b);  // == != < <= > >= in notin
Value negate(const Value& v);
Value get_attr(const Value& obj, const std::string& name);  // jinja2 getattr: attribute, then item
Value get_item(const Value& obj, const Value& key);         // jinja2 getitem: item, then attribute
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// methods.cpp: bound methods of str and dict (e.g. "abc".startswith); undefined when there is none.
Value get_method(const Value& obj, const std::string& name);

// filters.cpp / tests.cpp
bool has_filter(std::string_view name);
Value apply_filter(std::string_view name, const Value& v, const CallArgs& args);
bool has_test(std::string_view name);
bool apply_test(std::string_view name, const Value& v, const CallArgs& args);

// json_dump.cpp: Python's json.dumps(v, ensure_ascii, indent, separators, sort_keys).
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: all on one line
  std::string item_separator;  // empty: Python's default for the indent mode
  std::string key_separator;
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonOptions& opts);

// globals.cpp: raise_exception, strftime_now, namespace, range, dict, joiner-free minimal set.
void add_globals(Dict& globals);

}  // namespace kvfleet::jinja
