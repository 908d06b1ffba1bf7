// Sequence and mapping filters: length, join, map, select/reject, sort, unique, dictsort, ...
#include <algorithm>

#include "engine/core/chat_template/filter_util.h"
#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

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

}  // namespace

void add_sequence_filters(FilterTable& t) {
  t.insert({
      {"length", [](const Value& v, const CallArgs&) { return Value(py_len(v)); }},
      {"count", [](const Value& v, const CallArgs&) { return Value(py_len(v)); }},
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
  });
}

}  // namespace kvfleet::jinja
