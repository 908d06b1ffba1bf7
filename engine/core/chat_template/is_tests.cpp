// jinja2 tests: the right-hand side of `x is defined`, `x is not none`, `x is divisibleby(3)`.
#include <functional>
#include <map>

#include "engine/core/chat_template/builtins.h"
#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

using TestFn = std::function<bool(const Value&, const CallArgs&)>;

const Value& arg0(const CallArgs& a) {
  const Value* v = a.get(0, "other");
  if (!v) throw TemplateError("test needs an argument");
  return *v;
}

bool is_cased_as(const Value& v, bool upper) {
  if (!v.is_string()) return false;
  const std::string& s = v.as_string();
  bool any_cased = false;
  for (char32_t c : utf8_decode(s)) {
    std::string one;
    utf8_append(one, c);
    bool lower_c = py_upper(one) != one, upper_c = py_lower(one) != one;
    if (upper ? lower_c : upper_c) return false;
    any_cased = any_cased || lower_c || upper_c;
  }
  return any_cased;
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> t = {
      {"defined", [](const Value& v, const CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, const CallArgs&) { return v.is_none(); }},
      {"boolean", [](const Value& v, const CallArgs&) { return v.is_bool(); }},
      {"true", [](const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }},
      {"false", [](const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }},
      {"integer", [](const Value& v, const CallArgs&) { return v.is_int(); }},
      {"float", [](const Value& v, const CallArgs&) { return v.is_float(); }},
      {"number", [](const Value& v, const CallArgs&) { return v.is_number(); }},
      {"string", [](const Value& v, const CallArgs&) { return v.is_string(); }},
      {"mapping", [](const Value& v, const CallArgs&) { return v.is_dict() && !v.as_dict().is_namespace; }},
      // Python: anything with __iter__ (jinja2's Undefined has one); sequences also need len and []
      {"iterable", [](const Value& v, const CallArgs&) { return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined(); }},
      {"sequence", [](const Value& v, const CallArgs&) { return v.is_string() || v.is_list() || v.is_dict(); }},
      {"callable", [](const Value& v, const CallArgs&) { return v.is_callable(); }},
      {"lower", [](const Value& v, const CallArgs&) { return is_cased_as(v, false); }},
      {"upper", [](const Value& v, const CallArgs&) { return is_cased_as(v, true); }},
      {"odd", [](const Value& v, const CallArgs&) { return v.is_number() && !v.is_float() && v.as_int() % 2 != 0; }},
      {"even", [](const Value& v, const CallArgs&) { return v.is_number() && !v.is_float() && v.as_int() % 2 == 0; }},
      {"divisibleby", [](const Value& v, const CallArgs& a) {
         const Value& n = arg0(a);
         return v.is_number() && n.is_number() && n.as_int() != 0 && v.as_int() % n.as_int() == 0;
       }},
      {"eq", [](const Value& v, const CallArgs& a) { return compare_op("==", v, arg0(a)); }},
      {"equalto", [](const Value& v, const CallArgs& a) { return compare_op("==", v, arg0(a)); }},
      {"==", [](const Value& v, const CallArgs& a) { return compare_op("==", v, arg0(a)); }},
      {"ne", [](const Value& v, const CallArgs& a) { return compare_op("!=", v, arg0(a)); }},
      {"!=", [](const Value& v, const CallArgs& a) { return compare_op("!=", v, arg0(a)); }},
      {"lt", [](const Value& v, const CallArgs& a) { return compare_op("<", v, arg0(a)); }},
      {"<", [](const Value& v, const CallArgs& a) { return compare_op("<", v, arg0(a)); }},
      {"le", [](const Value& v, const CallArgs& a) { return compare_op("<=", v, arg0(a)); }},
      {"<=", [](const Value& v, const CallArgs& a) { return compare_op("<=", v, arg0(a)); }},
      {"gt", [](const Value& v, const CallArgs& a) { return compare_op(">", v, arg0(a)); }},
      {"greaterthan", [](const Value& v, const CallArgs& a) { return compare_op(">", v, arg0(a)); }},
      {">", [](const Value& v, const CallArgs& a) { return compare_op(">", v, arg0(a)); }},
      {"ge", [](const Value& v, const CallArgs& a) { return compare_op(">=", v, arg0(a)); }},
      {">=", [](const Value& v, const CallArgs& a) { return compare_op(">=", v, arg0(a)); }},
      {"in", [](const Value& v, const CallArgs& a) { return compare_op("in", v, arg0(a)); }},
      {"sameas", [](const Value& v, const CallArgs& a) {
         const Value& o = arg0(a);
         if (v.storage().index() != o.storage().index()) return false;
         if (v.is_none() || v.is_bool() || v.is_int() || v.is_float() || v.is_string()) return v == o;
         if (v.is_list()) return &v.as_list() == &o.as_list();
         if (v.is_dict()) return &v.as_dict() == &o.as_dict();
         return v == o;
       }},
  };
  return t;
}

}  // namespace

bool has_test(std::string_view name) { return tests().count(name) != 0; }

bool apply_test(std::string_view name, const Value& v, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw TemplateError("unsupported test '" + std::string(name) + "'");
  return it->second(v, args);
}

}  // namespace kvfleet::jinja
