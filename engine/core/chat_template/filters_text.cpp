// String and number filters, tojson and default. tojson is transformers' version:
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
#include <cmath>

#include "engine/core/chat_template/filter_util.h"
#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

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

}  // namespace

void add_text_filters(FilterTable& t) {
  t.insert({
      {"trim", [](const Value& v, const CallArgs& a) {
         const Value* chars = opt(a, 0, "chars");
         std::string cs = chars ? chars->str() : "";
         return Value(py_strip(v.str(), chars ? &cs : nullptr, true, true));
       }},
      {"tojson", do_tojson},
      {"default", do_default},
      {"d", do_default},
      {"upper", [](const Value& v, const CallArgs&) { return Value(py_upper(v.str())); }},
      {"lower", [](const Value& v, const CallArgs&) { return Value(py_lower(v.str())); }},
      {"capitalize", [](const Value& v, const CallArgs&) { return Value(py_capitalize(v.str())); }},
      {"title", [](const Value& v, const CallArgs&) { return Value(jinja_title(v.str())); }},
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
      {"indent", do_indent},
      {"wordcount", [](const Value& v, const CallArgs&) {
         return Value(static_cast<std::int64_t>(py_split(v.str(), nullptr, -1).size()));
       }},
  });
}

}  // namespace kvfleet::jinja
