// Bound methods of str and dict that templates call (message.content.strip(), tool.get('x')).
// The sandbox transformers uses forbids mutating methods (list.append, dict.update), so none exist here.
#include <map>

#include "engine/core/chat_template/builtins.h"
#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

const std::string* opt_string(const CallArgs& a, size_t i, std::string_view name) {
  const Value* v = a.get(i, name);
  if (!v || v->is_none()) return nullptr;
  if (!v->is_string()) throw TemplateError("expected a string argument, got " + v->type_name());
  return &v->as_string();
}

std::int64_t opt_int(const CallArgs& a, size_t i, std::string_view name, std::int64_t dflt) {
  const Value* v = a.get(i, name);
  if (!v || v->is_none()) return dflt;
  if (!v->is_int()) throw TemplateError("expected an integer argument, got " + v->type_name());
  return v->as_int();
}

const std::string& req_string(const CallArgs& a, size_t i, std::string_view name) {
  const std::string* s = opt_string(a, i, name);
  if (!s) throw TemplateError("missing argument '" + std::string(name) + "'");
  return *s;
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  for (auto& p : parts) items.emplace_back(std::move(p));
  return Value::list(std::move(items));
}

// startswith/endswith accept a string or a tuple of strings
bool affix_match(const std::string& s, const Value& arg, bool prefix) {
  auto one = [&](const Value& v) {
    if (!v.is_string()) throw TemplateError("startswith/endswith expects a string or tuple of strings");
    const std::string& x = v.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (arg.is_list()) {
    for (const auto& v : arg.as_list().items)
      if (one(v)) return true;
    return false;
  }
  return one(arg);
}

// Python str.format with {} / {0} / {name} fields and {{ }} escapes (no format specs).
std::string py_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if ((c == '{' || c == '}') && i + 1 < fmt.size() && fmt[i + 1] == c) {
      out.push_back(c);
      ++i;
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw TemplateError("single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) throw TemplateError("unsupported format field '{" + field + "}'");
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < a.args.size() ? &a.args[auto_index] : nullptr;
      ++auto_index;
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      // Digits only, and no more than fit (std::stoul throws for "1x" leftovers it ignores, and for overflow).
      if (field.size() > 9 || field.find_first_not_of("0123456789") != std::string::npos)
        throw TemplateError("unsupported format field '{" + field + "}'");
      size_t idx = std::stoul(field);
      v = idx < a.args.size() ? &a.args[idx] : nullptr;
    } else {
      for (const auto& [k, x] : a.kwargs)
        if (k == field) v = &x;
    }
    if (!v) throw TemplateError("format field '{" + field + "}' has no argument");
    out += v->str();
    i = close;
  }
  return out;
}


template <bool Left, bool Right>
Value str_strip(const Value& self, const CallArgs& a) {
  return Value(py_strip(self.as_string(), opt_string(a, 0, "chars"), Left, Right));
}

template <bool Prefix>
Value str_affix(const Value& self, const CallArgs& a) {
  const Value* arg = a.get(0, Prefix ? "prefix" : "suffix");
  if (!arg) throw TemplateError("startswith/endswith needs an argument");
  return Value(affix_match(self.as_string(), *arg, Prefix));
}

template <bool Reverse>
Value str_split(const Value& self, const CallArgs& a) {
  const std::string* sep = opt_string(a, 0, "sep");
  std::int64_t maxsplit = opt_int(a, 1, "maxsplit", -1);
  if (Reverse && maxsplit >= 0) throw TemplateError("unsupported rsplit with maxsplit");
  return string_list(py_split(self.as_string(), sep, maxsplit));
}

template <std::string (*F)(std::string_view)>
Value str_map(const Value& self, const CallArgs&) {
  return Value(F(self.as_string()));
}

Value str_replace(const Value& self, const CallArgs& a) {
  return Value(py_replace(self.as_string(), req_string(a, 0, "old"), req_string(a, 1, "new"), opt_int(a, 2, "count", -1)));
}

Value str_format(const Value& self, const CallArgs& a) { return Value(py_format(self.as_string(), a)); }

Value str_join(const Value& self, const CallArgs& a) {
  const Value* seq = a.get(0, "iterable");
  if (!seq) throw TemplateError("join needs an argument");
  std::string out;
  bool first = true;
  for (const auto& v : seq->iterate()) {
    if (!v.is_string()) throw TemplateError("sequence item: expected str instance, " + v.type_name() + " found");
    if (!first) out += self.as_string();
    out += v.as_string();
    first = false;
  }
  return Value(std::move(out));
}

Value str_find(const Value& self, const CallArgs& a) {
  const std::string& s = self.as_string();
  size_t pos = s.find(req_string(a, 0, "sub"));
  return Value(pos == std::string::npos ? std::int64_t{-1} : static_cast<std::int64_t>(utf8_length(s.substr(0, pos))));
}

Value str_count(const Value& self, const CallArgs& a) {
  const std::string& s = self.as_string();
  const std::string& sub = req_string(a, 0, "sub");
  if (sub.empty()) return Value(static_cast<std::int64_t>(utf8_length(s) + 1));  // Python counts the gaps
  return Value(static_cast<std::int64_t>(py_split(s, &sub, -1).size() - 1));
}

template <bool Prefix>
Value str_remove_affix(const Value& self, const CallArgs& a) {
  const std::string& s = self.as_string();
  const std::string& x = req_string(a, 0, Prefix ? "prefix" : "suffix");
  if (!affix_match(s, Value(x), Prefix)) return self;
  return Value(Prefix ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
}

template <bool Digit>
Value str_is(const Value& self, const CallArgs&) {
  auto cps = utf8_decode(self.as_string());
  if (cps.empty()) return Value(false);
  for (char32_t c : cps)
    if (Digit ? !(c >= '0' && c <= '9') : !py_isspace(c)) return Value(false);
  return Value(true);
}

const std::map<std::string, Method, std::less<>>& string_methods() {
  static const std::map<std::string, Method, std::less<>> m = {
      {"strip", str_strip<true, true>},     {"lstrip", str_strip<true, false>},
      {"rstrip", str_strip<false, true>},   {"startswith", str_affix<true>},
      {"endswith", str_affix<false>},       {"split", str_split<false>},
      {"rsplit", str_split<true>},          {"upper", str_map<py_upper>},
      {"lower", str_map<py_lower>},         {"title", str_map<py_title>},
      {"capitalize", str_map<py_capitalize>}, {"replace", str_replace},
      {"format", str_format},               {"join", str_join},
      {"find", str_find},                   {"count", str_count},
      {"removeprefix", str_remove_affix<true>}, {"removesuffix", str_remove_affix<false>},
      {"isdigit", str_is<true>},            {"isspace", str_is<false>},
  };
  return m;
}

Value dict_items(const Value& self, const CallArgs&) {
  std::vector<Value> out;
  for (const auto& [k, v] : self.as_dict().items) out.push_back(Value::list({Value(k), v}, true));
  return Value::list(std::move(out));
}

Value dict_keys(const Value& self, const CallArgs&) {
  std::vector<Value> out;
  for (const auto& kv : self.as_dict().items) out.emplace_back(kv.first);
  return Value::list(std::move(out));
}

Value dict_values(const Value& self, const CallArgs&) {
  std::vector<Value> out;
  for (const auto& kv : self.as_dict().items) out.push_back(kv.second);
  return Value::list(std::move(out));
}

Value dict_get(const Value& self, const CallArgs& a) {
  const Value* key = a.get(0, "key");
  if (!key) throw TemplateError("get needs a key");
  if (key->is_string())
    if (const Value* v = self.as_dict().find(key->as_string())) return *v;
  const Value* dflt = a.get(1, "default");
  return dflt ? *dflt : Value(None{});
}

const std::map<std::string, Method, std::less<>>& dict_methods() {
  static const std::map<std::string, Method, std::less<>> m = {
      {"items", dict_items}, {"keys", dict_keys}, {"values", dict_values}, {"get", dict_get}};
  return m;
}

}  // namespace

Method find_method(const Value& obj, std::string_view name) {
  const std::map<std::string, Method, std::less<>>* table = nullptr;
  if (obj.is_string()) table = &string_methods();
  if (obj.is_dict() && !obj.as_dict().is_namespace) table = &dict_methods();
  if (!table) return nullptr;
  auto it = table->find(name);
  return it == table->end() ? nullptr : it->second;
}

Value get_method(const Value& obj, const std::string& name) {
  Method m = find_method(obj, name);
  if (!m) return {};
  return Value::function(name, [self = obj, m](const CallArgs& a) { return m(self, a); });
}

}  // namespace kvfleet::jinja
