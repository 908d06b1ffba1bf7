// Bound methods of str and dict that templates call (message.content.strip(), tool.get('x')).
// The sandbox transformers uses forbids mutating methods (list.append, dict.update), so none exist here.
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

Value string_method(const std::string& s, const std::string& name) {
  using F = std::function<Value(const CallArgs&)>;
  F f;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    f = [s, left, right](const CallArgs& a) { return Value(py_strip(s, opt_string(a, 0, "chars"), left, right)); };
  } else if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    f = [s, prefix](const CallArgs& a) {
      const Value* arg = a.get(0, "prefix");
      if (!arg) throw TemplateError("startswith/endswith needs an argument");
      return Value(affix_match(s, *arg, prefix));
    };
  } else if (name == "split" || name == "rsplit") {
    bool rsplit = name == "rsplit";
    f = [s, rsplit](const CallArgs& a) {
      const std::string* sep = opt_string(a, 0, "sep");
      std::int64_t maxsplit = opt_int(a, 1, "maxsplit", -1);
      if (rsplit && maxsplit >= 0) throw TemplateError("unsupported rsplit with maxsplit");
      return string_list(py_split(s, sep, maxsplit));
    };
  } else if (name == "upper") {
    f = [s](const CallArgs&) { return Value(py_upper(s)); };
  } else if (name == "lower") {
    f = [s](const CallArgs&) { return Value(py_lower(s)); };
  } else if (name == "title") {
    f = [s](const CallArgs&) { return Value(py_title(s)); };
  } else if (name == "capitalize") {
    f = [s](const CallArgs&) { return Value(py_capitalize(s)); };
  } else if (name == "replace") {
    f = [s](const CallArgs& a) {
      return Value(py_replace(s, req_string(a, 0, "old"), req_string(a, 1, "new"), opt_int(a, 2, "count", -1)));
    };
  } else if (name == "format") {
    f = [s](const CallArgs& a) { return Value(py_format(s, a)); };
  } else if (name == "join") {
    f = [s](const CallArgs& a) {
      const Value* seq = a.get(0, "iterable");
      if (!seq) throw TemplateError("join needs an argument");
      std::string out;
      bool first = true;
      for (const auto& v : seq->iterate()) {
        if (!v.is_string()) throw TemplateError("sequence item: expected str instance, " + v.type_name() + " found");
        if (!first) out += s;
        out += v.as_string();
        first = false;
      }
      return Value(std::move(out));
    };
  } else if (name == "find" || name == "count") {
    bool find = name == "find";
    f = [s, find](const CallArgs& a) {
      const std::string& sub = req_string(a, 0, "sub");
      if (find) {
        size_t pos = s.find(sub);
        return Value(pos == std::string::npos ? std::int64_t{-1} : static_cast<std::int64_t>(utf8_length(s.substr(0, pos))));
      }
      if (sub.empty()) return Value(static_cast<std::int64_t>(utf8_length(s) + 1));  // Python counts the gaps
      return Value(static_cast<std::int64_t>(py_split(s, &sub, -1).size() - 1));
    };
  } else if (name == "removeprefix" || name == "removesuffix") {
    bool prefix = name == "removeprefix";
    f = [s, prefix](const CallArgs& a) {
      const std::string& x = req_string(a, 0, prefix ? "prefix" : "suffix");
      if (!affix_match(s, Value(x), prefix)) return Value(s);
      return Value(prefix ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    };
  } else if (name == "isdigit" || name == "isspace") {
    bool digit = name == "isdigit";
    f = [s, digit](const CallArgs&) {
      auto cps = utf8_decode(s);
      if (cps.empty()) return Value(false);
      for (char32_t c : cps)
        if (digit ? !(c >= '0' && c <= '9') : !py_isspace(c)) return Value(false);
      return Value(true);
    };
  } else {
    return {};
  }
  return Value::function(name, std::move(f));
}

Value dict_method(const Value& obj, const std::string& name) {
  std::shared_ptr<Dict> d = std::get<std::shared_ptr<Dict>>(obj.storage());
  using F = std::function<Value(const CallArgs&)>;
  F f;
  if (name == "items") {
    f = [d](const CallArgs&) {
      std::vector<Value> out;
      for (const auto& [k, v] : d->items) out.push_back(Value::list({Value(k), v}, true));
      return Value::list(std::move(out));
    };
  } else if (name == "keys") {
    f = [d](const CallArgs&) {
      std::vector<Value> out;
      for (const auto& kv : d->items) out.emplace_back(kv.first);
      return Value::list(std::move(out));
    };
  } else if (name == "values") {
    f = [d](const CallArgs&) {
      std::vector<Value> out;
      for (const auto& kv : d->items) out.push_back(kv.second);
      return Value::list(std::move(out));
    };
  } else if (name == "get") {
    f = [d](const CallArgs& a) {
      const Value* key = a.get(0, "key");
      if (!key) throw TemplateError("get needs a key");
      if (key->is_string())
        if (const Value* v = d->find(key->as_string())) return *v;
      const Value* dflt = a.get(1, "default");
      return dflt ? *dflt : Value(None{});
    };
  } else {
    return {};
  }
  return Value::function(name, std::move(f));
}

}  // namespace

Value get_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj.as_string(), name);
  if (obj.is_dict() && !obj.as_dict().is_namespace) return dict_method(obj, name);
  return {};
}

}  // namespace kvfleet::jinja
