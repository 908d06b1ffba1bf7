#include "engine/core/chat_template/value.h"

#include <boost/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < args.size()) return &args[i];
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->is_tuple = is_tuple;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<Dict>()); }

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}

Value Value::from_json(const boost::json::value& j) {
  switch (j.kind()) {
    case boost::json::kind::null: return Value(None{});
    case boost::json::kind::bool_: return Value(j.get_bool());
    case boost::json::kind::int64: return Value(j.get_int64());
    case boost::json::kind::uint64: {
      auto u = j.get_uint64();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return Value(static_cast<std::int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case boost::json::kind::double_: return Value(j.get_double());
    case boost::json::kind::string: return Value(std::string(j.get_string()));
    case boost::json::kind::array: {
      std::vector<Value> items;
      items.reserve(j.get_array().size());
      for (const auto& x : j.get_array()) items.push_back(from_json(x));
      return list(std::move(items));
    }
    case boost::json::kind::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.get_object().size());
      for (const auto& kv : j.get_object()) d->items.emplace_back(std::string(kv.key()), from_json(kv.value()));
      return Value(std::move(d));
    }
  }
  return Value(None{});
}

std::int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<std::int64_t>(v_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  struct V {
    bool operator()(const Undefined&) const { return false; }
    bool operator()(const None&) const { return false; }
    bool operator()(bool b) const { return b; }
    bool operator()(std::int64_t i) const { return i != 0; }
    bool operator()(double d) const { return d != 0.0; }
    bool operator()(const std::string& s) const { return !s.empty(); }
    bool operator()(const std::shared_ptr<List>& l) const { return !l->items.empty(); }
    bool operator()(const std::shared_ptr<Dict>& d) const { return !d->items.empty(); }
    bool operator()(const std::shared_ptr<Callable>&) const { return true; }
  };
  return std::visit(V{}, v_);
}

std::string Value::type_name() const {
  static const char* names[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"};
  if (is_list() && as_list().is_tuple) return "tuple";
  if (is_dict() && as_dict().is_namespace) return "Namespace";
  return names[v_.index()];
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  size_t epos = sci.find('e');
  int exp = std::atoi(sci.c_str() + epos + 1);
  std::string mant = sci.substr(0, epos);
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {  // Python repr switches to exponent notation outside [1e-4, 1e16)
    out.push_back(digits[0]);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + ebuf;
  }
  if (exp < 0) return out.append("0.").append(static_cast<size_t>(-exp - 1), '0').append(digits);
  size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) return out.append(digits).append(int_len - digits.size(), '0').append(".0");
  return out.append(digits, 0, int_len).append(".").append(digits, int_len);
}

std::string Value::str() const {
  if (is_undefined()) return "";
  if (is_string()) return as_string();
  return repr();
}

std::string Value::repr() const {
  struct V {
    std::string operator()(const Undefined&) const { return ""; }
    std::string operator()(const None&) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(std::int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return python_float_repr(d); }
    std::string operator()(const std::string& s) const { return py_repr_string(s); }
    std::string operator()(const std::shared_ptr<List>& l) const {
      std::string out = l->is_tuple ? "(" : "[";
      for (size_t i = 0; i < l->items.size(); ++i) out += (i ? ", " : "") + l->items[i].repr();
      if (l->is_tuple && l->items.size() == 1) out += ",";
      return out + (l->is_tuple ? ")" : "]");
    }
    std::string operator()(const std::shared_ptr<Dict>& d) const {
      std::string out = d->is_namespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < d->items.size(); ++i)
        out += (i ? ", " : "") + py_repr_string(d->items[i].first) + ": " + d->items[i].second.repr();
      return out + (d->is_namespace ? "}>" : "}");
    }
    std::string operator()(const std::shared_ptr<Callable>& c) const { return "<function " + c->name + ">"; }
  };
  return std::visit(V{}, v_);
}

std::vector<Value> Value::iterate() const {
  if (is_list()) return as_list().items;
  if (is_dict()) {
    std::vector<Value> keys;
    for (const auto& kv : as_dict().items) keys.emplace_back(kv.first);
    return keys;
  }
  if (is_string()) {
    std::vector<Value> chars;
    for (char32_t c : utf8_decode(as_string())) {
      std::string s;
      utf8_append(s, c);
      chars.emplace_back(std::move(s));
    }
    return chars;
  }
  if (is_undefined()) return {};  // jinja2: iterating an undefined yields nothing
  throw TemplateError("'" + type_name() + "' object is not iterable");
}

boost::json::value Value::to_json() const {
  struct V {
    boost::json::value operator()(const Undefined&) const { return nullptr; }
    boost::json::value operator()(const None&) const { return nullptr; }
    boost::json::value operator()(bool b) const { return b; }
    boost::json::value operator()(std::int64_t i) const { return i; }
    boost::json::value operator()(double d) const { return d; }
    boost::json::value operator()(const std::string& s) const { return boost::json::string(s); }
    boost::json::value operator()(const std::shared_ptr<List>& l) const {
      boost::json::array a;
      for (const auto& x : l->items) a.push_back(x.to_json());
      return a;
    }
    boost::json::value operator()(const std::shared_ptr<Dict>& d) const {
      boost::json::object o;
      for (const auto& [k, v] : d->items) o[k] = v.to_json();
      return o;
    }
    boost::json::value operator()(const std::shared_ptr<Callable>&) const { return nullptr; }
  };
  return std::visit(V{}, v_);
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.storage().index() != b.storage().index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.as_string() == b.as_string();
  if (a.is_list()) {
    if (a.as_list().is_tuple != b.as_list().is_tuple) return false;  // Python: [1] != (1,)
    const auto &x = a.as_list().items, &y = b.as_list().items;
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!(x[i] == y[i])) return false;
    return true;
  }
  if (a.is_dict()) {
    const auto &x = a.as_dict(), &y = b.as_dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* w = y.find(k);
      if (!w || !(v == *w)) return false;
    }
    return true;
  }
  return &a.as_callable() == &b.as_callable();
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order == code point order
  if (a.is_list() && b.is_list()) {
    const auto &x = a.as_list().items, &y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!(x[i] == y[i])) return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw TemplateError("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

}  // namespace kvfleet::jinja
