// Arithmetic, comparison, attribute/item access and slicing with Python semantics.
#include <cmath>
#include <cstdio>

#include "engine/core/chat_template/builtins.h"
#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {

void throw_undefined(const Value& v) {
  throw TemplateError(v.undefined_hint().empty() ? "undefined value used" : v.undefined_hint());
}

namespace {

[[noreturn]] void type_error(std::string_view op, const Value& a, const Value& b) {
  throw TemplateError("unsupported operand type(s) for " + std::string(op) + ": '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value arithmetic(std::string_view op, const Value& a, const Value& b) {
  const bool ints = !a.is_float() && !b.is_float();
  if (op == "+") return ints ? Value(a.as_int() + b.as_int()) : Value(a.as_double() + b.as_double());
  if (op == "-") return ints ? Value(a.as_int() - b.as_int()) : Value(a.as_double() - b.as_double());
  if (op == "*") return ints ? Value(a.as_int() * b.as_int()) : Value(a.as_double() * b.as_double());
  if (op == "/") {
    if (b.as_double() == 0) throw TemplateError("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0) throw TemplateError(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (ints) {
      std::int64_t q = floor_div(a.as_int(), b.as_int());
      return op == "//" ? Value(q) : Value(a.as_int() - q * b.as_int());
    }
    double q = std::floor(a.as_double() / b.as_double());
    return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
  }
  // "**"
  if (ints && b.as_int() >= 0) {
    std::int64_t r = 1, base = a.as_int();
    for (std::int64_t e = b.as_int(); e > 0; --e) r *= base;
    return Value(r);
  }
  return Value(std::pow(a.as_double(), b.as_double()));
}

Value repeat(const Value& seq, std::int64_t n) {
  // A bound against a template (or a number from a request) asking for gigabytes.
  const size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().items.size();
  if (n > 0 && unit > 0 && static_cast<std::uint64_t>(n) > (std::uint64_t{1} << 26) / unit)
    throw TemplateError("repetition result too large");
  if (seq.is_string()) {
    std::string out;
    for (std::int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (std::int64_t i = 0; i < n; ++i)
    out.insert(out.end(), seq.as_list().items.begin(), seq.as_list().items.end());
  return Value::list(std::move(out), seq.as_list().is_tuple);
}

// Python's printf-style `fmt % args` for %s %r %d %i %f %x %% with flags, width and precision.
Value percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> items = args.is_list() && args.as_list().is_tuple ? args.as_list().items : std::vector<Value>{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    size_t j = i + 1;
    while (j < fmt.size() && std::string_view("-+ #0").find(fmt[j]) != std::string_view::npos) ++j;
    while (j < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[j])) || fmt[j] == '.')) ++j;
    if (j >= fmt.size()) throw TemplateError("incomplete format");
    const char conv = fmt[j];
    std::string spec = fmt.substr(i, j - i);
    i = j;
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (next >= items.size()) throw TemplateError("not enough arguments for format string");
    const Value& v = items[next++];
    char buf[512];
    if (conv == 's' || conv == 'r') {
      std::string text = conv == 's' ? v.str() : v.repr();
      std::snprintf(buf, sizeof buf, (spec + "s").c_str(), text.c_str());
    } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X') {
      if (!v.is_number()) throw TemplateError("%" + std::string(1, conv) + " format: a real number is required, not " + v.type_name());
      long long n = v.is_float() ? static_cast<long long>(v.as_double()) : static_cast<long long>(v.as_int());
      std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), n);
    } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'g') {
      if (!v.is_number()) throw TemplateError("must be real number, not " + v.type_name());
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_double());
    } else {
      throw TemplateError("unsupported format character '" + std::string(1, conv) + "'");
    }
    out += buf;
  }
  if (next < items.size()) throw TemplateError("not all arguments converted during string formatting");
  return Value(std::move(out));
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") return Value(a.str() + b.str());
  if (a.is_undefined()) throw_undefined(a);
  if (op == "%" && a.is_string()) return percent_format(a.as_string(), b);
  if (b.is_undefined()) throw_undefined(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
      auto items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::list(std::move(items), a.as_list().is_tuple);
    }
    if (a.is_string())
      throw TemplateError("can only concatenate str (not \"" + b.type_name() + "\") to str");
    if (a.is_list())
      throw TemplateError("can only concatenate list (not \"" + b.type_name() + "\") to list");
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  }
  type_error(op, a, b);
}

Value negate(const Value& v) {
  if (v.is_undefined()) throw_undefined(v);
  if (v.is_float()) return Value(-v.as_double());
  if (v.is_number()) return Value(-v.as_int());
  throw TemplateError("bad operand type for unary -: '" + v.type_name() + "'");
}

namespace {
bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      throw TemplateError("'in <string>' requires string as left operand, not " + item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const auto& x : container.as_list().items)
      if (x == item) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
  if (container.is_undefined()) return false;  // jinja2's Undefined iterates as empty
  throw TemplateError("argument of type '" + container.type_name() + "' is not iterable");
}
}  // namespace

bool compare_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return a == b;
  if (op == "!=") return !(a == b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  if (op == "<") return less_than(a, b);
  if (op == ">") return less_than(b, a);
  if (op == "<=") return less_than(a, b) || a == b;
  if (op == ">=") return less_than(b, a) || a == b;
  throw TemplateError("unknown comparison '" + std::string(op) + "'");
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) throw_undefined(obj);
  Value method = get_method(obj, name);
  if (!method.is_undefined()) return method;
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
  }
  std::string hint = "'";
  hint.append(obj.type_name()).append(" object' has no attribute '").append(name).append("'");
  return Value::undefined(std::move(hint));
}

namespace {
// Python's index normalisation for a sequence of length n; false when out of range.
bool normalise_index(std::int64_t& i, size_t n) {
  if (i < 0) i += static_cast<std::int64_t>(n);
  return i >= 0 && i < static_cast<std::int64_t>(n);
}
}  // namespace

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) throw_undefined(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
  } else if (obj.is_list() && (key.is_int() || key.is_bool())) {
    std::int64_t i = key.as_int();
    if (normalise_index(i, obj.as_list().items.size())) return obj.as_list().items[static_cast<size_t>(i)];
  } else if (obj.is_string() && (key.is_int() || key.is_bool())) {
    auto cps = utf8_decode(obj.as_string());
    std::int64_t i = key.as_int();
    if (normalise_index(i, cps.size())) return Value(utf8_encode({cps[static_cast<size_t>(i)]}));
  }
  if (key.is_string() && !obj.is_dict()) return get_attr(obj, key.as_string());
  std::string hint = "'";
  hint.append(obj.type_name()).append(" object' has no attribute ").append(key.repr());
  return Value::undefined(std::move(hint));
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) throw_undefined(obj);
  auto num = [](const Value& v, std::int64_t dflt) {
    if (v.is_undefined() || v.is_none()) return dflt;
    if (!v.is_int() && !v.is_bool()) throw TemplateError("slice indices must be integers or None");
    return v.as_int();
  };
  std::int64_t step = num(step_v, 1);
  if (step == 0) throw TemplateError("slice step cannot be zero");
  std::vector<char32_t> cps;
  std::int64_t n;
  if (obj.is_string()) {
    cps = utf8_decode(obj.as_string());
    n = static_cast<std::int64_t>(cps.size());
  } else if (obj.is_list()) {
    n = static_cast<std::int64_t>(obj.as_list().items.size());
  } else {
    throw TemplateError("'" + obj.type_name() + "' object is not subscriptable");
  }
  // CPython's PySlice_AdjustIndices
  auto adjust = [&](std::int64_t i, bool is_start) {
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    (void)is_start;
    return i;
  };
  std::int64_t start = start_v.is_undefined() || start_v.is_none() ? (step < 0 ? n - 1 : 0) : adjust(num(start_v, 0), true);
  std::int64_t stop = stop_v.is_undefined() || stop_v.is_none() ? (step < 0 ? -1 : n) : adjust(num(stop_v, 0), false);
  std::vector<size_t> picks;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::string out;
    for (size_t i : picks) utf8_append(out, cps[i]);
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (size_t i : picks) out.push_back(obj.as_list().items[i]);
  return Value::list(std::move(out), obj.as_list().is_tuple);
}

}  // namespace kvfleet::jinja
