// jinja2 filters (`x | name(args)`), with jinja2 3.1's argument names and defaults. The filters
// themselves live in filters_text.cpp and filters_sequence.cpp; this file is the registry.
#include <algorithm>

#include "engine/core/chat_template/filter_util.h"
#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {

bool flag(const CallArgs& a, size_t i, std::string_view name, bool dflt) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : dflt;
}

const Value* opt(const CallArgs& a, size_t i, std::string_view name) {
  const Value* v = a.get(i, name);
  return v && !v->is_none() ? v : nullptr;
}

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

namespace {
const FilterTable& filters() {
  static const FilterTable table = [] {
    FilterTable t;
    add_text_filters(t);
    add_sequence_filters(t);
    return t;
  }();
  return table;
}
}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) != 0; }

Value apply_filter(std::string_view name, const Value& v, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw TemplateError("unsupported filter '" + std::string(name) + "'");
  return it->second(v, args);
}

}  // namespace kvfleet::jinja
