// Helpers shared by the filter groups (filters_text.cpp, filters_sequence.cpp).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "engine/core/chat_template/builtins.h"

namespace kvfleet::jinja {

using FilterFn = std::function<Value(const Value&, const CallArgs&)>;
using FilterTable = std::map<std::string, FilterFn, std::less<>>;

void add_text_filters(FilterTable& t);      // strings, numbers, tojson, default
void add_sequence_filters(FilterTable& t);  // lists, dicts, iteration

// Argument i (or keyword `name`) as a bool, `dflt` when absent.
bool flag(const CallArgs& a, size_t i, std::string_view name, bool dflt);
// Argument i (or keyword `name`), nullptr when absent or none.
const Value* opt(const CallArgs& a, size_t i, std::string_view name);
// jinja2's make_attrgetter: "a.b.0" looks up item by item.
Value attr_path(const Value& item, const Value& attribute);

}  // namespace kvfleet::jinja
