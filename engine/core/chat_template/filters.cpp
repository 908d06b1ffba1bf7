// jinja2 filters (`x | name(args)`), with jinja2 3.1's argument names and defaults. tojson is
// transformers' version: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "engine/core/chat_template/builtins.h"
#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

using FilterFn = std::function<Value(const Value&, const CallArgs&)>;

bool flag(const CallArgs& a, size_t i, std::string_view name, bool dflt) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : dflt;
}

const Value* opt(const CallArgs& a, size_t i, std::string_view name) {
  const Value* v = a.get(i, name);
  return v && !v->is_none() ? v : nullptr;
}

// jinja2's make_attrgetter: "a.b.0" looks up item by item.
Value attr_path(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  Value cur = item;
  static const std::string dot = ".";
  for (const auto& part : py_split(attribute.str(), &dot, -1)) {
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(cur, Value(static_cast<std::int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
  }
  return cur;
}

Value fold_case(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(py_lower(v.as_string())) : v;
}

std::int64_t py_len(const Value& v) {
  if (v.is_string()) return static_cast<std::int64_t>(utf8_length(v.as_string()));
  if (v.is_list()) return static_cast<std::int64_t>(v.as_list().items.size());
  if (v.is_dict()) return static_cast<std::int64_t>(v.as_dict().items.size());
  if (v.is_undefined()) return 0;
  throw TemplateError("object of type '" + v.type_name() + "' has no len()");
}

std::vector<Value> sorted(std::vector<Value> items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less_than(key(y), key(x)) : less_than(key(x), key(y));
  });
  return items;
}

// select/reject/selectattr/rejectattr: args are (test name, test args...) after an optional attribute.
Value select_or_reject(const Value& seq, const CallArgs& a, bool want, bool by_attr) {
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (a.args.empty()) throw TemplateError("selectattr/rejectattr need an attribute");
    attribute = a.args[next++];
  }
  std::string test;
  CallArgs test_args;
  if (next < a.args.size()) {
    test = a.args[next++].str();
    test_args.args.assign(a.args.begin() + static_cast<long>(next), a.args.end());
    test_args.kwargs = a.kwargs;
  }
  std::vector<Value> out;
  for (const auto& item : seq.iterate()) {
    Value x = by_attr ? attr_path(item, attribute) : item;
    bool ok = test.empty() ? x.truthy() : apply_test(test, x, test_args);
    if (ok == want) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value do_map(const Value& seq, const CallArgs& a) {
  std::vector<Value> out;
  if (const Value* attribute = a.get(99, "attribute")) {
    const Value* dflt = a.get(99, "default");
    for (const auto& item : seq.iterate()) {
      Value v = attr_path(item, *attribute);
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
    return Value::list(std::move(out));
  }
  if (a.args.empty()) throw TemplateError("map needs a filter name or attribute=");
  std::string filter = a.args[0].str();
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const auto& item : seq.iterate()) out.push_back(apply_filter(filter, item, rest));
  return Value::list(std::move(out));
}

Value do_indent(const Value& v, const CallArgs& a) {
  std::string ind = "    ";
  if (const Value* w = opt(a, 0, "width")) ind = w->is_string() ? w->as_string() : std::string(static_cast<size_t>(w->as_int()), ' ');
  bool first = flag(a, 1, "first", false), blank = flag(a, 2, "blank", false);
  std::string s = v.str() + "\n";
  std::vector<std::string> lines;  // Python splitlines on \n-joined text (other separators are rare here)
  for (size_t pos = 0, nl; (nl = s.find('\n', pos)) != std::string::npos; pos = nl + 1) lines.push_back(s.substr(pos, nl - pos));
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) rv += "\n";
    if (i > 0 && (blank || !lines[i].empty())) rv += ind;
    rv += lines[i];
  }
  return Value(first ? ind + rv : rv);
}

Value do_round(const Value& v, const CallArgs& a) {
  std::int64_t precision = opt(a, 0, "precision") ? opt(a, 0, "precision")->as_int() : 0;
  std::string method = opt(a, 1, "method") ? opt(a, 1, "method")->str() : "common";
  if (v.is_int() && method == "common") return v;
  double scale = std::pow(10.0, static_cast<double>(precision)), x = v.as_double() * scale;
  double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value(r / scale);
}

Value do_int(const Value& v, const CallArgs& a) {
  Value dflt = opt(a, 0, "default") ? *opt(a, 0, "default") : Value(0);
  if (v.is_number()) return v.is_float() ? Value(static_cast<std::int64_t>(v.as_double())) : Value(v.as_int());
  if (!v.is_string()) return dflt;
  std::string s = py_strip(v.as_string(), nullptr, true, true);
  try {
    size_t used = 0;
    std::int64_t i = std::stoll(s, &used, 10);
    if (used == s.size()) return Value(i);
    double d = std::stod(s, &used);
    if (used == s.size()) return Value(static_cast<std::int64_t>(d));
  } catch (const std::exception&) {
  }
  return dflt;
}

Value do_float(const Value& v, const CallArgs& a) {
  Value dflt = opt(a, 0, "default") ? *opt(a, 0, "default") : Value(0.0);
  if (v.is_number()) return Value(v.as_double());
  if (!v.is_string()) return dflt;
  std::string s = py_strip(v.as_string(), nullptr, true, true);
  try {
    size_t used = 0;
    double d = std::stod(s, &used);
    if (used == s.size()) return Value(d);
  } catch (const std::exception&) {
  }
  return dflt;
}

Value do_default(const Value& v, const CallArgs& a) {
  const Value* d = a.get(0, "default_value");
  bool use = v.is_undefined() || (flag(a, 1, "boolean", false) && !v.truthy());
  return use ? (d ? *d : Value("")) : v;
}

Value do_tojson(const Value& v, const CallArgs& a) {
  JsonOptions o;
  o.ensure_ascii = flag(a, 0, "ensure_ascii", false);
  if (const Value* ind = opt(a, 1, "indent")) o.indent = static_cast<int>(ind->as_int());
  if (const Value* sep = opt(a, 2, "separators")) {
    if (!sep->is_list() || sep->as_list().items.size() != 2) throw TemplateError("tojson separators must be a pair");
    o.item_separator = sep->as_list().items[0].str();
    o.key_separator = sep->as_list().items[1].str();
  }
  o.sort_keys = flag(a, 3, "sort_keys", false);
  return Value(json_dumps(v, o));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> f = {
      {"trim", [](const Value& v, const CallArgs& a) {
         const Value* chars = opt(a, 0, "chars");
         std::string cs = chars ? chars->str() : "";
         return Value(py_strip(v.str(), chars ? &cs : nullptr, true, true));
       }},
      {"tojson", do_tojson},
      {"length", [](const Value& v, const CallArgs&) { return Value(py_len(v)); }},
      {"count", [](const Value& v, const CallArgs&) { return Value(py_len(v)); }},
      {"default", do_default},
      {"d", do_default},
      {"upper", [](const Value& v, const CallArgs&) { return Value(py_upper(v.str())); }},
      {"lower", [](const Value& v, const CallArgs&) { return Value(py_lower(v.str())); }},
      {"capitalize", [](const Value& v, const CallArgs&) { return Value(py_capitalize(v.str())); }},
      {"title", [](const Value& v, const CallArgs&) { return Value(jinja_title(v.str())); }},
      {"join", [](const Value& v, const CallArgs& a) {
         const Value* sep = opt(a, 0, "d");
         const Value* attribute = opt(a, 1, "attribute");
         std::string out, s = sep ? sep->str() : "";
         bool first = true;
         for (const auto& item : v.iterate()) {
           if (!first) out += s;
           out += (attribute ? attr_path(item, *attribute) : item).str();
           first = false;
         }
         return Value(std::move(out));
       }},
      {"first", [](const Value& v, const CallArgs&) {
         auto items = v.iterate();
         return items.empty() ? Value::undefined("no first item, sequence was empty") : items.front();
       }},
      {"last", [](const Value& v, const CallArgs&) {
         auto items = v.iterate();
         return items.empty() ? Value::undefined("no last item, sequence was empty") : items.back();
       }},
      {"list", [](const Value& v, const CallArgs&) { return Value::list(v.iterate()); }},
      {"items", [](const Value& v, const CallArgs&) {
         if (v.is_undefined()) return Value::list();
         if (!v.is_dict()) throw TemplateError("can only get item pairs from a mapping");
         return get_method(v, "items").as_callable().fn(CallArgs{});
       }},
      {"map", do_map},
      {"select", [](const Value& v, const CallArgs& a) { return select_or_reject(v, a, true, false); }},
      {"reject", [](const Value& v, const CallArgs& a) { return select_or_reject(v, a, false, false); }},
      {"selectattr", [](const Value& v, const CallArgs& a) { return select_or_reject(v, a, true, true); }},
      {"rejectattr", [](const Value& v, const CallArgs& a) { return select_or_reject(v, a, false, true); }},
      {"replace", [](const Value& v, const CallArgs& a) {
         const Value* old = a.get(0, "old");
         const Value* repl = a.get(1, "new");
         if (!old || !repl) throw TemplateError("replace needs old and new");
         const Value* count = opt(a, 2, "count");
         return Value(py_replace(v.str(), old->str(), repl->str(), count ? count->as_int() : -1));
       }},
      {"string", [](const Value& v, const CallArgs&) { return Value(v.str()); }},
      {"safe", [](const Value& v, const CallArgs&) { return v; }},
      {"escape", [](const Value& v, const CallArgs&) { return Value(html_escape(v.str())); }},
      {"e", [](const Value& v, const CallArgs&) { return Value(html_escape(v.str())); }},
      {"int", do_int},
      {"float", do_float},
      {"round", do_round},
      {"abs", [](const Value& v, const CallArgs&) {
         if (v.is_float()) return Value(std::fabs(v.as_double()));
         if (v.is_number()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
         throw TemplateError("bad operand type for abs(): '" + v.type_name() + "'");
       }},
      {"unique", [](const Value& v, const CallArgs& a) {
         bool cs = flag(a, 0, "case_sensitive", false);
         const Value* attribute = opt(a, 1, "attribute");
         std::vector<Value> out, seen;
         for (const auto& item : v.iterate()) {
           Value key = fold_case(attribute ? attr_path(item, *attribute) : item, cs);
           if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
           seen.push_back(key);
           out.push_back(item);
         }
         return Value::list(std::move(out));
       }},
      {"dictsort", [](const Value& v, const CallArgs& a) {
         bool cs = flag(a, 0, "case_sensitive", false);
         std::string by = opt(a, 1, "by") ? opt(a, 1, "by")->str() : "key";
         if (by != "key" && by != "value") throw TemplateError("You can only sort by either \"key\" or \"value\"");
         size_t pos = by == "key" ? 0 : 1;
         Value pairs = get_method(v, "items").as_callable().fn(CallArgs{});
         return Value::list(sorted(pairs.as_list().items,
                                   [&](const Value& p) { return fold_case(p.as_list().items[pos], cs); },
                                   flag(a, 2, "reverse", false)));
       }},
      {"sort", [](const Value& v, const CallArgs& a) {
         bool cs = flag(a, 1, "case_sensitive", false);
         const Value* attribute = opt(a, 2, "attribute");
         return Value::list(sorted(v.iterate(),
                                   [&](const Value& x) { return fold_case(attribute ? attr_path(x, *attribute) : x, cs); },
                                   flag(a, 0, "reverse", false)));
       }},
      {"reverse", [](const Value& v, const CallArgs&) {
         if (v.is_string()) {
           auto cps = utf8_decode(v.as_string());
           std::reverse(cps.begin(), cps.end());
           return Value(utf8_encode(cps));
         }
         auto items = v.iterate();
         std::reverse(items.begin(), items.end());
         return Value::list(std::move(items));
       }},
      {"sum", [](const Value& v, const CallArgs& a) {
         const Value* attribute = opt(a, 0, "attribute");
         Value total = opt(a, 1, "start") ? *opt(a, 1, "start") : Value(0);
         for (const auto& item : v.iterate()) total = binary_op("+", total, attribute ? attr_path(item, *attribute) : item);
         return total;
       }},
      {"min", [](const Value& v, const CallArgs& a) {
         auto s = sorted(v.iterate(), [&](const Value& x) { return fold_case(x, flag(a, 0, "case_sensitive", false)); }, false);
         return s.empty() ? Value::undefined("no aggregated item, sequence was empty") : s.front();
       }},
      {"max", [](const Value& v, const CallArgs& a) {
         auto s = sorted(v.iterate(), [&](const Value& x) { return fold_case(x, flag(a, 0, "case_sensitive", false)); }, true);
         return s.empty() ? Value::undefined("no aggregated item, sequence was empty") : s.front();
       }},
      {"indent", do_indent},
      {"wordcount", [](const Value& v, const CallArgs&) {
         return Value(static_cast<std::int64_t>(py_split(v.str(), nullptr, -1).size()));
       }},
  };
  return f;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) != 0; }

Value apply_filter(std::string_view name, const Value& v, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw TemplateError("unsupported filter '" + std::string(name) + "'");
  return it->second(v, args);
}

}  // namespace kvfleet::jinja
