// Python's json.dumps, byte for byte: transformers' tojson filter is json.dumps with ensure_ascii=False,
// and tool schemas reach the prompt through it.
#include <algorithm>
#include <cmath>

#include "engine/core/chat_template/builtins.h"
#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& o) : o_(o) {
    item_sep_ = !o.item_separator.empty() ? o.item_separator : (o.indent >= 0 ? "," : ", ");
    key_sep_ = !o.key_separator.empty() ? o.key_separator : ": ";
  }

  void write(const Value& v, int level) {
    if (v.is_none()) out_ += "null";
    else if (v.is_bool()) out_ += v.as_bool() ? "true" : "false";
    else if (v.is_int()) out_ += std::to_string(v.as_int());
    else if (v.is_float()) write_float(v.as_double());
    else if (v.is_string()) json_quote(out_, v.as_string(), o_.ensure_ascii);
    else if (v.is_list()) write_list(v.as_list(), level);
    else if (v.is_dict()) write_dict(v.as_dict(), level);
    else throw TemplateError("Object of type " + std::string(v.is_undefined() ? "Undefined" : v.type_name()) +
                             " is not JSON serializable");
  }

  std::string take() { return std::move(out_); }

 private:
  void write_float(double d) {
    if (std::isnan(d)) out_ += "NaN";
    else if (std::isinf(d)) out_ += d < 0 ? "-Infinity" : "Infinity";
    else out_ += python_float_repr(d);
  }

  void newline(int level) {
    if (o_.indent < 0) return;
    out_.push_back('\n');
    out_.append(static_cast<size_t>(o_.indent * level), ' ');
  }

  void write_list(const List& l, int level) {
    if (l.items.empty()) {
      out_ += "[]";
      return;
    }
    out_.push_back('[');
    for (size_t i = 0; i < l.items.size(); ++i) {
      if (i) out_ += item_sep_;
      newline(level + 1);
      write(l.items[i], level + 1);
    }
    newline(level);
    out_.push_back(']');
  }

  void write_dict(const Dict& d, int level) {
    if (d.items.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : d.items) items.push_back(&kv);
    if (o_.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out_.push_back('{');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out_ += item_sep_;
      newline(level + 1);
      json_quote(out_, items[i]->first, o_.ensure_ascii);
      out_ += key_sep_;
      write(items[i]->second, level + 1);
    }
    newline(level);
    out_.push_back('}');
  }

  const JsonOptions& o_;
  std::string item_sep_, key_sep_, out_;
};

}  // namespace

std::string json_dumps(const Value& v, const JsonOptions& opts) {
  JsonWriter w(opts);
  w.write(v, 0);
  return w.take();
}

}  // namespace kvfleet::jinja
