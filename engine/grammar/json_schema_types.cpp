// JSON Schema front end: strings (length, pattern, format), numbers (integer-valued bounds), objects
// (properties in order, required, additionalProperties) and arrays (items, prefixes, counts).
#include <cmath>
#include <optional>
#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <set>

#include "engine/grammar/front_ends.h"
#include "engine/grammar/json_schema.h"

namespace kvfleet::grammar {
namespace json = boost::json;
namespace {

std::optional<std::size_t> count(const json::object& s, const char* key, const std::string& path) {
  const auto* v = s.if_contains(key);
  if (!v) return std::nullopt;
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<std::size_t>(v->get_int64());
  if (v->is_uint64()) return static_cast<std::size_t>(v->get_uint64());
  if (v->is_double() && v->get_double() >= 0 && std::floor(v->get_double()) == v->get_double()) {
    return static_cast<std::size_t>(v->get_double());
  }
  throw GrammarError(std::string(key) + " must be a non-negative integer", path, key);
}

std::optional<std::int64_t> integral(const json::value& v, const char* key, const std::string& path) {
  double d = 0;
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64()) d = static_cast<double>(v.get_uint64());
  else if (v.is_double()) d = v.get_double();
  else throw GrammarError(std::string(key) + " must be a number", path, key);
  if (std::floor(d) != d || std::fabs(d) > 1e15) {
    throw GrammarError(std::string(key) + " supports integer values only", path, key);
  }
  return static_cast<std::int64_t>(d);
}

const char* format_regex(std::string_view format) {
  if (format == "date") return R"(\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8])))";
  if (format == "time") return R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d))";
  if (format == "date-time") {
    return R"(\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))[tT]([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d))";
  }
  if (format == "email") return R"([a-zA-Z0-9_+-]+(\.[a-zA-Z0-9_+-]+)*@([a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?\.)+[a-zA-Z]{2,10})";
  if (format == "uuid") return R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";
  if (format == "uri") return R"([a-zA-Z][a-zA-Z0-9+.-]{0,15}://[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?)*(/[a-zA-Z0-9._~%-]*)*(\?[a-zA-Z0-9._~%!$&'()*+,;=:@/?-]*)?(#[a-zA-Z0-9._~%!$&'()*+,;=:@/?-]*)?)";
  return nullptr;
}

ExprPtr digit(int lo, int hi) { return byte_range(static_cast<unsigned char>('0' + lo), static_cast<unsigned char>('0' + hi)); }

// Decimal strings of one length from a to b (a <= b), leading digits as written.
ExprPtr same_length(const std::string& a, const std::string& b) {
  if (a.empty()) return empty();
  if (a == b) return literal(a);
  const std::string rest_a = a.substr(1), rest_b = b.substr(1);
  if (a[0] == b[0]) return seq({literal(a.substr(0, 1)), same_length(rest_a, rest_b)});
  const int x = a[0] - '0', y = b[0] - '0';
  if (rest_a.find_first_not_of('0') == std::string::npos && rest_b.find_first_not_of('9') == std::string::npos) {
    return seq({digit(x, y), repeat(digit(0, 9), rest_a.size(), rest_a.size())});
  }
  std::vector<ExprPtr> alts{seq({digit(x, x), same_length(rest_a, std::string(rest_a.size(), '9'))})};
  if (y - x > 1) alts.push_back(seq({digit(x + 1, y - 1), repeat(digit(0, 9), rest_a.size(), rest_a.size())}));
  alts.push_back(seq({digit(y, y), same_length(std::string(rest_b.size(), '0'), rest_b)}));
  return alt(std::move(alts));
}

// Non-negative integers in [lo, hi] (hi absent: no bound), without leading zeros.
ExprPtr uint_range(std::int64_t lo, std::optional<std::int64_t> hi) {
  std::vector<ExprPtr> alts;
  const std::size_t lo_digits = std::to_string(lo).size();
  const std::size_t hi_digits = hi ? std::to_string(*hi).size() : lo_digits;
  std::int64_t power = 1;
  for (std::size_t d = 1; d < lo_digits; ++d) power *= 10;
  for (std::size_t d = lo_digits; d <= hi_digits; ++d, power *= 10) {
    const std::int64_t first = std::max(lo, d == 1 ? 0 : power);
    const std::int64_t last = hi ? std::min(*hi, power * 10 - 1) : power * 10 - 1;
    if (first <= last) alts.push_back(same_length(std::to_string(first), std::to_string(last)));
  }
  if (!hi) alts.push_back(seq({digit(1, 9), repeat(digit(0, 9), lo_digits, kUnbounded)}));
  if (alts.empty()) return bytes(ByteSet{});
  return alt(std::move(alts));
}

struct Bound {
  std::int64_t value;
  bool exclusive;
};

// Magnitudes m >= 0 with lower <= m <= upper (each inclusive or not), as integer part + fraction.
ExprPtr magnitude(Bound lower, std::optional<Bound> upper, bool integer) {
  const std::int64_t a = lower.value;
  if (integer) {
    const std::int64_t lo = lower.exclusive ? a + 1 : a;
    std::optional<std::int64_t> hi;
    if (upper) hi = upper->exclusive ? upper->value - 1 : upper->value;
    if (hi && *hi < lo) return nullptr;
    return uint_range(lo, hi);
  }
  const ExprPtr frac_digits = repeat(digit(0, 9), 1, kUnbounded);
  const ExprPtr any_frac = optional(seq({literal("."), frac_digits}));
  std::vector<ExprPtr> alts;
  const std::int64_t low_any = lower.exclusive ? a + 1 : a;
  std::optional<std::int64_t> high_any;
  if (upper) high_any = upper->value - 1;
  if (!high_any || *high_any >= low_any) alts.push_back(seq({uint_range(low_any, high_any), any_frac}));
  if (lower.exclusive && (!upper || a < upper->value)) {
    alts.push_back(seq({literal(std::to_string(a)), literal("."), repeat(digit(0, 9), 0, kUnbounded), digit(1, 9),
                        repeat(digit(0, 9), 0, kUnbounded)}));
  }
  if (upper && !upper->exclusive && (upper->value > a || (upper->value == a && !lower.exclusive))) {
    alts.push_back(seq({literal(std::to_string(upper->value)), optional(seq({literal("."), repeat(literal("0"), 1, kUnbounded)}))}));
  }
  if (alts.empty()) return nullptr;
  return alt(std::move(alts));
}

std::optional<Bound> bound(const json::object& s, const char* key, const char* exclusive_key, const std::string& path) {
  std::optional<Bound> out;
  if (const auto* v = s.if_contains(key)) out = Bound{*integral(*v, key, path), false};
  if (const auto* x = s.if_contains(exclusive_key)) {
    if (x->is_bool()) {  // draft 4: a flag on minimum/maximum
      if (out) out->exclusive = x->get_bool();
    } else {
      const Bound b{*integral(*x, exclusive_key, path), true};
      const bool tighter = !out || (std::string_view(key) == "minimum" ? b.value >= out->value : b.value <= out->value);
      if (tighter) out = b;
    }
  }
  return out;
}

}  // namespace

ExprPtr SchemaTypes::string(SchemaConverter& c, const json::object& s, const std::string& path) {
  const auto min = count(s, "minLength", path), max = count(s, "maxLength", path);
  const auto* pattern = s.if_contains("pattern");
  const auto* format = s.if_contains("format");
  const ExprPtr quote = literal("\"");
  if (pattern || format) {
    const char* key = pattern ? "pattern" : "format";
    if (pattern && format) throw GrammarError("pattern together with format is not supported", path, "format");
    if (min || max) throw GrammarError(std::string(key) + " together with minLength/maxLength is not supported", path, key);
    if (!(pattern ? pattern : format)->is_string()) throw GrammarError(std::string(key) + " must be a string", path, key);
    const std::string text((pattern ? pattern : format)->get_string());
    if (pattern) {
      try {
        return seq({quote, regex_expr(text, RegexText::json_string, false), quote});
      } catch (const GrammarError& e) {
        throw GrammarError(e.what(), path, "pattern");
      }
    }
    const char* re = format_regex(text);
    if (!re) throw GrammarError("unsupported format '" + text + "'", path, "format");
    return seq({quote, regex_expr(re, RegexText::json_string, true), quote});
  }
  if (min && max && *max < *min) throw GrammarError("maxLength is below minLength", path, "maxLength");
  return seq({quote, repeat(ref(c.char_rule_), min.value_or(0), max.value_or(kUnbounded)), quote});
}

ExprPtr SchemaTypes::number(SchemaConverter& c, const json::object& s, const std::string& path, bool integer) {
  const auto lower = bound(s, "minimum", "exclusiveMinimum", path);
  const auto upper = bound(s, "maximum", "exclusiveMaximum", path);
  if (!lower && !upper) return ref(integer ? c.integer_rule_ : c.number_rule_);
  std::vector<ExprPtr> alts;
  // x >= 0: magnitude x. x < 0: "-" magnitude -x, with -x > 0.
  const bool positive_possible = !upper || upper->value > 0 || (upper->value == 0 && !upper->exclusive);
  if (positive_possible) {
    const Bound lo = lower && lower->value >= 0 ? *lower : Bound{0, false};
    if (ExprPtr m = magnitude(lo, upper, integer)) alts.push_back(m);
  }
  const bool negative_possible = !lower || lower->value < 0;
  if (negative_possible) {
    const Bound lo = upper && upper->value < 0 ? Bound{-upper->value, upper->exclusive} : Bound{0, true};
    std::optional<Bound> hi;
    if (lower) hi = Bound{-lower->value, lower->exclusive};
    if (ExprPtr m = magnitude(lo, hi, integer)) alts.push_back(seq({literal("-"), m}));
  }
  if (alts.empty()) throw GrammarError("no number satisfies minimum/maximum", path, "minimum");
  return alt(std::move(alts));
}

ExprPtr SchemaTypes::object(SchemaConverter& c, const json::object& s, const std::string& path) {
  std::vector<std::pair<std::string, ExprPtr>> props;  // (key literal, value)
  std::vector<std::string> names;
  std::set<std::string> required;
  if (const auto* r = s.if_contains("required")) {
    if (!r->is_array()) throw GrammarError("required must be an array", path, "required");
    for (const auto& n : r->get_array()) required.insert(std::string(n.as_string()));
  }
  std::vector<char> is_required;
  if (const auto* p = s.if_contains("properties")) {
    if (!p->is_object()) throw GrammarError("properties must be an object", path, "properties");
    for (const auto& [name, sub] : p->get_object()) {
      const std::string sub_path = path + "/properties/" + std::string(name);
      props.emplace_back(canonical_json(json::value(name)), c.convert(sub, sub_path));
      names.emplace_back(name);
      is_required.push_back(required.contains(std::string(name)));
    }
  }
  ExprPtr extra_value;
  if (const auto* a = s.if_contains("additionalProperties")) {
    if (!(a->is_bool() && !a->get_bool())) extra_value = c.convert(*a, path + "/additionalProperties");
  } else if (!c.options_.strict_objects) {
    extra_value = c.any_value();
  }
  for (const std::string& r : required) {
    if (std::find(names.begin(), names.end(), r) != names.end()) continue;
    if (!extra_value) throw GrammarError("required property '" + r + "' is not allowed by the schema", path, "required");
    props.emplace_back(canonical_json(json::value(r)), extra_value);
    names.push_back(r);
    is_required.push_back(1);
  }
  const ExprPtr sep = seq({c.ws(), literal(","), c.ws()});
  auto member = [&](const ExprPtr& key, const ExprPtr& value) { return seq({key, c.ws(), literal(":"), c.ws(), value}); };
  // Keys not listed: printable ASCII without escapes, never equal to a listed key (a trie complement).
  ExprPtr tail_first = empty(), tail_after = empty();
  if (extra_value) {
    struct Trie {
      std::map<unsigned char, Trie> next;
      bool end = false;
    } trie;
    for (const std::string& n : names) {
      if (!std::all_of(n.begin(), n.end(), [](char ch) { return ch >= 0x20 && ch < 0x7F && ch != '"' && ch != '\\'; })) continue;
      Trie* t = &trie;
      for (const char ch : n) t = &t->next[static_cast<unsigned char>(ch)];
      t->end = true;
    }
    ByteSet plain;
    for (int ch = 0x20; ch < 0x7F; ++ch) plain.set(ch);
    plain.reset('"'), plain.reset('\\');
    const ExprPtr any_plain = repeat(bytes(plain), 0, kUnbounded);
    std::function<ExprPtr(const Trie&)> not_in = [&](const Trie& t) {
      std::vector<ExprPtr> alts;
      if (!t.end) alts.push_back(empty());
      ByteSet other = plain;
      for (const auto& [ch, sub] : t.next) {
        other.reset(ch);
        alts.push_back(seq({bytes(ByteSet().set(ch)), not_in(sub)}));
      }
      if (other.any()) alts.push_back(seq({bytes(other), any_plain}));
      return alt(std::move(alts));
    };
    const int extra_rule = c.new_rule(path + " additional property");
    c.g_.rules[extra_rule] = member(seq({literal("\""), not_in(trie), literal("\"")}), extra_value);
    const ExprPtr more = repeat(seq({sep, ref(extra_rule)}), 0, kUnbounded);
    tail_first = optional(seq({ref(extra_rule), more}));
    tail_after = more;
  }
  // rest[i][first]: properties i.. given whether one was written already; a rule each keeps it linear.
  std::vector<std::array<int, 2>> rest(props.size() + 1);
  for (std::size_t i = 0; i <= props.size(); ++i) {
    rest[i] = {c.new_rule(path + " properties " + std::to_string(i)), c.new_rule(path + " properties " + std::to_string(i) + " first")};
  }
  c.g_.rules[rest[props.size()][0]] = tail_after;
  c.g_.rules[rest[props.size()][1]] = tail_first;
  for (std::size_t i = props.size(); i-- > 0;) {
    const ExprPtr m = member(literal(props[i].first), props[i].second);
    for (const int first : {0, 1}) {
      const ExprPtr with = seq({first ? empty() : sep, m, ref(rest[i + 1][0])});
      c.g_.rules[rest[i][first]] = is_required[i] ? with : alt({with, ref(rest[i + 1][first])});
    }
  }
  return seq({literal("{"), c.ws(), ref(rest[0][1]), c.ws(), literal("}")});
}

ExprPtr SchemaTypes::array(SchemaConverter& c, const json::object& s, const std::string& path) {
  std::vector<ExprPtr> prefix;
  ExprPtr rest = c.any_value();
  const json::value* items = s.if_contains("items");
  const json::value* prefix_items = s.if_contains("prefixItems");
  if (items && items->is_array()) {  // draft 4 tuple form
    prefix_items = items;
    items = s.if_contains("additionalItems");
  }
  if (prefix_items) {
    if (!prefix_items->is_array()) throw GrammarError("prefixItems must be an array", path, "prefixItems");
    std::size_t i = 0;
    for (const auto& sub : prefix_items->get_array()) prefix.push_back(c.convert(sub, path + "/items/" + std::to_string(i++)));
  }
  if (items) {
    if (items->is_bool() && !items->get_bool()) rest = nullptr;
    else rest = c.convert(*items, path + "/items");
  }
  const std::size_t min = count(s, "minItems", path).value_or(0);
  std::size_t max = count(s, "maxItems", path).value_or(kUnbounded);
  if (!rest) max = std::min(max, prefix.size());
  if (max < min) throw GrammarError("no array satisfies minItems/maxItems/items", path, "minItems");
  const ExprPtr sep = seq({c.ws(), literal(","), c.ws()});
  auto element = [&](std::size_t i) { return i < prefix.size() ? prefix[i] : rest; };
  // after[i]: elements i.. once i were written (i >= 1).
  const std::size_t fixed = std::max({prefix.size(), min, std::size_t{1}});  // element 0 is written outside
  ExprPtr tail;
  if (max == kUnbounded) tail = repeat(seq({sep, rest}), 0, kUnbounded);
  else tail = max > fixed ? repeat(seq({sep, rest}), 0, max - fixed) : empty();
  ExprPtr after = tail;  // after[fixed]
  for (std::size_t i = std::min(fixed, max); i-- > 1;) {
    const int rule = c.new_rule(path + " items " + std::to_string(i));
    const ExprPtr next = seq({sep, element(i), after});
    c.g_.rules[rule] = i >= min ? alt({empty(), next}) : next;
    after = ref(rule);
  }
  if (max == 0) return seq({literal("["), c.ws(), literal("]")});
  const ExprPtr body = seq({element(0), after, c.ws()});
  return seq({literal("["), c.ws(), min == 0 ? optional(body) : body, literal("]")});
}

}  // namespace kvfleet::grammar
