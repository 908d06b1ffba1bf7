// The interpreter's dynamic value: Python/jinja2 semantics for the types that chat templates touch.
// Lists and dicts are shared (copying a Value aliases them, as Python references do); only namespace()
// objects are ever mutated, so values built from the request's JSON are read-only while rendering.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kvfleet::jinja {

class Value;

struct Undefined {
  std::string hint;  // what was looked up, for the error raised when the value is used
};
struct None {};

struct List {
  std::vector<Value> items;
  bool is_tuple = false;  // only changes how it prints: (a, b) instead of [a, b]
};

// Insertion-ordered, like Python's dict. Linear lookup: template dicts hold a handful of keys.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // jinja2 namespace(): the only object `set x.attr = ...` may change
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // The i-th positional argument or the keyword `name`; nullptr when neither was passed.
  const Value* get(size_t i, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

class Value {
 public:
  using Storage = std::variant<Undefined, None, bool, std::int64_t, double, std::string, std::shared_ptr<List>,
                               std::shared_ptr<Dict>, std::shared_ptr<Callable>>;

  Value() : v_(Undefined{}) {}
  Value(None n) : v_(n) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(std::int64_t{i}) {}
  Value(std::int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::shared_ptr<List> l) : v_(std::move(l)) {}
  Value(std::shared_ptr<Dict> d) : v_(std::move(d)) {}
  Value(std::shared_ptr<Callable> c) : v_(std::move(c)) {}

  static Value undefined(std::string hint) { Value v; v.v_ = Undefined{std::move(hint)}; return v; }
  static Value list(std::vector<Value> items = {}, bool is_tuple = false);
  static Value dict();
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);
  static Value from_json(const boost::json::value& j);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<std::int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(v_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  std::int64_t as_int() const;  // bool or int
  double as_double() const;     // bool, int or float
  const std::string& as_string() const { return std::get<std::string>(v_); }
  List& as_list() const { return *std::get<std::shared_ptr<List>>(v_); }
  Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

  bool truthy() const;                // Python truthiness; undefined is false
  std::string type_name() const;      // Python's name: 'str', 'int', 'list', 'dict', ...
  std::string str() const;            // Python str(): what {{ value }} prints
  std::string repr() const;           // Python repr()
  std::vector<Value> iterate() const; // for-loop items: list items, dict keys, string characters
  boost::json::value to_json() const;

  const Storage& storage() const { return v_; }

 private:
  Storage v_;
};

bool operator==(const Value& a, const Value& b);  // Python ==: 1 == 1.0 == True, deep for containers
// Python <, for numbers, strings and lists; throws TemplateError for other pairs.
bool less_than(const Value& a, const Value& b);

// Python float repr: shortest round-trip digits, "1.0", "1e+20", "inf", "nan".
std::string python_float_repr(double d);

}  // namespace kvfleet::jinja
