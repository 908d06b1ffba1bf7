// JSON Schema front end: keyword dispatch, $ref, enum/const, anyOf/oneOf/allOf, and the shared rules.
#include "engine/grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <set>

#include "engine/grammar/front_ends.h"

namespace kvfleet::grammar {
namespace json = boost::json;
namespace {

const std::set<std::string, std::less<>> kAnnotations{
    "title", "description", "examples", "default", "$schema", "$id", "id", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "definitions", "$defs", "$anchor", "discriminator"};
const std::set<std::string, std::less<>> kHandled{
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern", "format", "uniqueItems"};

void write_json_string(std::string& out, std::string_view s) {
  static constexpr const char* kHex = "0123456789abcdef";
  out.push_back('"');
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += std::string("\\u00") + kHex[c >> 4] + kHex[c & 15];
        else out.push_back(ch);
    }
  }
  out.push_back('"');
}

void write_json(std::string& out, const json::value& v) {
  switch (v.kind()) {
    case json::kind::null: out += "null"; break;
    case json::kind::bool_: out += v.get_bool() ? "true" : "false"; break;
    case json::kind::int64: out += std::to_string(v.get_int64()); break;
    case json::kind::uint64: out += std::to_string(v.get_uint64()); break;
    case json::kind::double_: {
      const double d = v.get_double();
      if (std::floor(d) == d && std::fabs(d) < 1e15) {
        out += std::to_string(static_cast<std::int64_t>(d));
      } else {
        char buf[64];
        const auto r = std::to_chars(buf, buf + sizeof buf, d);
        out.append(buf, r.ptr);
      }
      break;
    }
    case json::kind::string: write_json_string(out, v.get_string()); break;
    case json::kind::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v.get_array()) {
        if (!first) out.push_back(',');
        first = false;
        write_json(out, e);
      }
      out.push_back(']');
      break;
    }
    case json::kind::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.get_object()) {
        if (!first) out.push_back(',');
        first = false;
        write_json_string(out, k);
        out.push_back(':');
        write_json(out, e);
      }
      out.push_back('}');
      break;
    }
  }
}

std::string kind_of(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null: return "null";
    case json::kind::bool_: return "boolean";
    case json::kind::string: return "string";
    case json::kind::array: return "array";
    case json::kind::object: return "object";
    case json::kind::double_: return std::floor(v.get_double()) == v.get_double() ? "integer" : "number";
    default: return "integer";
  }
}

bool type_allows(const std::string& type, const std::string& kind) {
  return type == kind || (type == "number" && kind == "integer");
}

}  // namespace

std::string canonical_json(const json::value& v) {
  std::string out;
  write_json(out, v);
  return out;
}

SchemaConverter::SchemaConverter(const json::value& root, const GrammarOptions& options) : root_(root), options_(options) {
  ws_rule_ = new_rule("ws");
  ByteSet space;
  for (const char c : {' ', '\t', '\n', '\r'}) space.set(static_cast<unsigned char>(c));
  g_.rules[ws_rule_] = repeat(bytes(space), 0, options.whitespace_bound);
  char_rule_ = new_rule("char");
  ByteSet esc;
  for (const char c : std::string_view("\"\\/bfnrt")) esc.set(static_cast<unsigned char>(c));
  ByteSet hex;
  for (const char c : std::string_view("0123456789abcdefABCDEF")) hex.set(static_cast<unsigned char>(c));
  g_.rules[char_rule_] = alt({utf8_ranges(complement({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}})),
                              seq({literal("\\"), alt({bytes(esc), seq({literal("u"), repeat(bytes(hex), 4, 4)})})})});
  string_rule_ = new_rule("string");
  g_.rules[string_rule_] = seq({literal("\""), repeat(ref(char_rule_), 0, kUnbounded), literal("\"")});
  integer_rule_ = new_rule("integer");
  const ExprPtr digits = repeat(byte_range('0', '9'), 1, kUnbounded);
  const ExprPtr int_part = alt({literal("0"), seq({byte_range('1', '9'), repeat(byte_range('0', '9'), 0, kUnbounded)})});
  g_.rules[integer_rule_] = seq({optional(literal("-")), int_part});
  number_rule_ = new_rule("number");
  ByteSet e, sign;
  e.set('e'), e.set('E'), sign.set('+'), sign.set('-');
  g_.rules[number_rule_] = seq({optional(literal("-")), int_part, optional(seq({literal("."), digits})),
                                optional(seq({bytes(e), optional(bytes(sign)), digits}))});
  value_rule_ = new_rule("value");
  object_rule_ = new_rule("object");
  array_rule_ = new_rule("array");
  g_.rules[value_rule_] = alt({ref(object_rule_), ref(array_rule_), ref(string_rule_), ref(number_rule_),
                               literal("true"), literal("false"), literal("null")});
  const ExprPtr member = seq({ref(string_rule_), ws(), literal(":"), ws(), ref(value_rule_)});
  g_.rules[object_rule_] = seq({literal("{"), ws(),
                                optional(seq({member, repeat(seq({ws(), literal(","), ws(), member}), 0, kUnbounded), ws()})),
                                literal("}")});
  g_.rules[array_rule_] = seq({literal("["), ws(),
                               optional(seq({ref(value_rule_),
                                             repeat(seq({ws(), literal(","), ws(), ref(value_rule_)}), 0, kUnbounded), ws()})),
                               literal("]")});
}

Grammar SchemaConverter::take(ExprPtr root_expr) {
  g_.root = new_rule("root");
  g_.rules[g_.root] = std::move(root_expr);
  return std::move(g_);
}

ExprPtr SchemaConverter::convert(const json::value& schema, const std::string& path) {
  if (schema.is_bool()) {
    if (schema.get_bool()) return any_value();
    throw GrammarError("the schema `false` matches nothing", path, "false");
  }
  if (!schema.is_object()) throw GrammarError("a schema must be an object or a boolean", path);
  if (++depth_ > 200) throw GrammarError("the schema is nested too deeply", path);
  ExprPtr out = convert_object_schema(schema.get_object(), path);
  --depth_;
  return out;
}

ExprPtr SchemaConverter::convert_object_schema(const json::object& s, const std::string& path) {
  for (const auto& [key, v] : s) {
    if (kAnnotations.contains(key)) continue;
    if (!kHandled.contains(key)) {
      throw GrammarError("unsupported JSON Schema keyword '" + std::string(key) + "'", path, std::string(key));
    }
    if (key == "uniqueItems" && !(v.is_bool() && !v.get_bool())) {
      throw GrammarError("unsupported JSON Schema keyword 'uniqueItems'", path, "uniqueItems");
    }
  }
  auto siblings_except = [&](std::initializer_list<std::string_view> allowed, const char* keyword) {
    for (const auto& [key, v] : s) {
      if (kAnnotations.contains(key) || key == "uniqueItems") continue;
      if (std::find(allowed.begin(), allowed.end(), std::string_view(key)) != allowed.end()) continue;
      throw GrammarError(std::string("'") + std::string(key) + "' next to '" + keyword + "' is not supported", path,
                         std::string(key));
    }
  };
  if (const auto* r = s.if_contains("$ref")) {
    siblings_except({"$ref"}, "$ref");
    if (!r->is_string()) throw GrammarError("$ref must be a string", path, "$ref");
    return by_ref(std::string(r->get_string()), path);
  }
  if (s.contains("allOf")) return convert(json::value(merge_all_of(s, path)), path);
  // Keywords next to anyOf/oneOf hold in every branch: {base, anyOf: [A, B]} is anyOf [allOf [base, A],
  // allOf [base, B]] (and the same for oneOf: with base true, exactly one of base&A, base&B is exactly one
  // of A, B).
  for (const char* keyword : {"anyOf", "oneOf"}) {
    const auto* branches = s.if_contains(keyword);
    if (!branches) continue;
    json::object base;
    for (const auto& [key, v] : s) {
      if (key != keyword && !kAnnotations.contains(key) && !(key == "uniqueItems" && v.is_bool() && !v.get_bool())) {
        base[key] = v;
      }
    }
    if (base.empty()) break;
    if (!branches->is_array() || branches->get_array().empty()) {
      throw GrammarError(std::string(keyword) + " must be a non-empty array", path, keyword);
    }
    json::array distributed;
    for (const auto& branch : branches->get_array()) {
      distributed.push_back(merge_all_of(json::object{{"allOf", json::array{base, branch}}}, path));
    }
    return convert(json::value(json::object{{keyword, std::move(distributed)}}), path);
  }
  if (const auto* any = s.if_contains("anyOf")) {
    siblings_except({"anyOf"}, "anyOf");
    if (!any->is_array() || any->get_array().empty()) throw GrammarError("anyOf must be a non-empty array", path, "anyOf");
    std::vector<ExprPtr> alts;
    std::size_t i = 0;
    for (const auto& branch : any->get_array()) alts.push_back(convert(branch, path + "/anyOf/" + std::to_string(i++)));
    return alt(std::move(alts));
  }
  if (s.contains("oneOf")) return one_of(s, path);
  if (s.contains("enum") || s.contains("const")) return enum_values(s, path);
  std::vector<std::string> types;
  if (const auto* t = s.if_contains("type")) {
    if (t->is_string()) types.emplace_back(t->get_string());
    else if (t->is_array()) {
      for (const auto& e : t->get_array()) {
        if (!e.is_string()) throw GrammarError("type must be a string or a list of strings", path, "type");
        types.emplace_back(e.get_string());
      }
    } else {
      throw GrammarError("type must be a string or a list of strings", path, "type");
    }
  } else {
    types = {"null", "boolean", "object", "array", "number", "string"};
  }
  if (std::find(types.begin(), types.end(), "number") != types.end()) std::erase(types, std::string("integer"));
  std::vector<ExprPtr> alts;
  for (const std::string& type : types) alts.push_back(typed(s, type, path));
  if (alts.empty()) throw GrammarError("an empty list of types matches nothing", path, "type");
  return alt(std::move(alts));
}

ExprPtr SchemaConverter::typed(const json::object& s, const std::string& type, const std::string& path) {
  if (type == "null") return literal("null");
  if (type == "boolean") return alt({literal("true"), literal("false")});
  if (type == "string") return SchemaTypes::string(*this, s, path);
  if (type == "number") return SchemaTypes::number(*this, s, path, false);
  if (type == "integer") return SchemaTypes::number(*this, s, path, true);
  if (type == "object") return SchemaTypes::object(*this, s, path);
  if (type == "array") return SchemaTypes::array(*this, s, path);
  throw GrammarError("unknown type '" + type + "'", path, "type");
}

ExprPtr SchemaConverter::by_ref(const std::string& target, const std::string& path) {
  if (target.empty() || target[0] != '#') {
    throw GrammarError("only references inside the schema (\"#...\") are supported: " + target, path, "$ref");
  }
  if (const auto it = ref_rules_.find(target); it != ref_rules_.end()) return ref(it->second);
  const json::value* node = &root_;
  std::string_view rest = std::string_view(target).substr(1);
  while (!rest.empty()) {
    if (rest[0] != '/') throw GrammarError("unsupported $ref " + target, path, "$ref");
    rest.remove_prefix(1);
    const std::size_t end = std::min(rest.find('/'), rest.size());
    std::string token;
    for (std::size_t k = 0; k < end; ++k) {
      if (rest[k] == '~' && k + 1 < end) token.push_back(rest[++k] == '1' ? '/' : '~');
      else if (rest[k] == '%' && k + 2 < end) {
        token.push_back(static_cast<char>(std::stoi(std::string(rest.substr(k + 1, 2)), nullptr, 16)));
        k += 2;
      } else token.push_back(rest[k]);
    }
    rest.remove_prefix(end);
    if (node->is_object() && node->get_object().contains(token)) node = &node->get_object().at(token);
    else if (node->is_array() && !token.empty() && std::all_of(token.begin(), token.end(), ::isdigit) &&
             std::stoul(token) < node->get_array().size()) node = &node->get_array().at(std::stoul(token));
    else throw GrammarError("$ref " + target + " points to nothing", path, "$ref");
  }
  const int rule = new_rule("ref " + target);
  ref_rules_[target] = rule;
  g_.rules[rule] = convert(*node, target);
  return ref(rule);
}

ExprPtr SchemaConverter::enum_values(const json::object& s, const std::string& path) {
  for (const auto& [key, v] : s) {
    if (kAnnotations.contains(key) || key == "enum" || key == "const" || key == "type") continue;
    throw GrammarError("'" + std::string(key) + "' next to enum/const is not supported", path, std::string(key));
  }
  std::vector<json::value> values;
  if (const auto* c = s.if_contains("const")) values.push_back(*c);
  if (const auto* e = s.if_contains("enum")) {
    if (!e->is_array()) throw GrammarError("enum must be an array", path, "enum");
    if (s.contains("const")) throw GrammarError("enum next to const is not supported", path, "enum");
    values.assign(e->get_array().begin(), e->get_array().end());
  }
  std::vector<ExprPtr> alts;
  for (const auto& v : values) {
    if (const auto* t = s.if_contains("type")) {
      bool ok = false;
      for (const auto& ty : t->is_array() ? t->get_array() : json::array{*t}) {
        ok = ok || (ty.is_string() && type_allows(std::string(ty.get_string()), kind_of(v)));
      }
      if (!ok) continue;
    }
    alts.push_back(literal(canonical_json(v)));
  }
  if (alts.empty()) throw GrammarError("no enum value satisfies the schema", path, s.contains("enum") ? "enum" : "const");
  return alt(std::move(alts));
}

// oneOf accepts an instance valid for exactly one branch; an alternation is exact only when no instance
// can match two branches: branches of different types, or objects told apart by a required constant.
ExprPtr SchemaConverter::one_of(const json::object& s, const std::string& path) {
  const auto* one = s.if_contains("oneOf");
  if (!one->is_array() || one->get_array().empty()) throw GrammarError("oneOf must be a non-empty array", path, "oneOf");
  for (const auto& [key, v] : s) {
    if (!kAnnotations.contains(key) && key != "oneOf") {
      throw GrammarError("'" + std::string(key) + "' next to 'oneOf' is not supported", path, std::string(key));
    }
  }
  const auto& branches = one->get_array();
  auto types_of = [&](const json::value& b) {
    std::set<std::string> out;
    const json::object* o = b.if_object();
    if (o && o->contains("$ref") && o->at("$ref").is_string()) o = nullptr;
    if (o && o->contains("type")) {
      const auto& t = o->at("type");
      for (const auto& ty : t.is_array() ? t.get_array() : json::array{t}) {
        if (ty.is_string()) out.insert(std::string(ty.get_string()) == "integer" ? "number" : std::string(ty.get_string()));
      }
    } else if (o && (o->contains("const") || o->contains("enum"))) {
      for (const auto& v : o->contains("const") ? json::array{o->at("const")} : o->at("enum").as_array()) {
        const std::string k = kind_of(v);
        out.insert(k == "integer" ? "number" : k);
      }
    } else {
      out = {"any"};
    }
    return out;
  };
  auto discriminator = [&](const json::value& b, const std::string& key) -> std::optional<std::string> {
    const json::object* o = b.if_object();
    if (!o || !o->contains("properties") || !o->contains("required")) return std::nullopt;
    const auto* props = o->at("properties").if_object();
    const auto* req = o->at("required").if_array();
    if (!props || !req || !props->contains(key) || std::find(req->begin(), req->end(), json::value(key)) == req->end()) {
      return std::nullopt;
    }
    const auto* p = props->at(key).if_object();
    if (p && p->contains("const")) return canonical_json(p->at("const"));
    if (p && p->contains("enum") && p->at("enum").is_array() && p->at("enum").get_array().size() == 1) {
      return canonical_json(p->at("enum").get_array()[0]);
    }
    return std::nullopt;
  };
  for (std::size_t i = 0; i < branches.size(); ++i) {
    for (std::size_t j = i + 1; j < branches.size(); ++j) {
      const auto a = types_of(branches[i]), b = types_of(branches[j]);
      bool disjoint = !a.contains("any") && !b.contains("any");
      for (const auto& t : a) disjoint = disjoint && !b.contains(t);
      if (disjoint) continue;
      bool told_apart = false;
      if (const auto* o = branches[i].if_object(); o && o->contains("properties") && o->at("properties").is_object()) {
        for (const auto& [key, v] : o->at("properties").get_object()) {
          const auto x = discriminator(branches[i], std::string(key)), y = discriminator(branches[j], std::string(key));
          told_apart = told_apart || (x && y && *x != *y);
        }
      }
      if (!told_apart) {
        throw GrammarError("oneOf branches " + std::to_string(i) + " and " + std::to_string(j) +
                               " may both match; only branches of different types or with different required "
                               "constant properties are supported",
                           path, "oneOf");
      }
    }
  }
  std::vector<ExprPtr> alts;
  for (std::size_t i = 0; i < branches.size(); ++i) alts.push_back(convert(branches[i], path + "/oneOf/" + std::to_string(i)));
  return alt(std::move(alts));
}

// allOf of subschemas that do not share a keyword (properties merge when their names differ, required
// lists join, an equal type may repeat) is one schema with all their keywords.
json::object SchemaConverter::merge_all_of(const json::object& s, const std::string& path) {
  const auto* all = s.if_contains("allOf");
  if (!all->is_array() || all->get_array().empty()) throw GrammarError("allOf must be a non-empty array", path, "allOf");
  std::vector<json::object> parts;
  json::object parent = s;
  parent.erase("allOf");
  parts.push_back(parent);
  for (const auto& branch : all->get_array()) {
    const json::value* b = &branch;
    for (int hops = 0; b->is_object() && b->get_object().size() == 1 && b->get_object().contains("$ref"); ++hops) {
      const std::string target(b->get_object().at("$ref").as_string());
      if (hops > 8 || target.size() < 1 || target[0] != '#') throw GrammarError("allOf: unsupported $ref", path, "allOf");
      boost::system::error_code ec;
      const auto* ptr = root_.find_pointer(target.substr(1), ec);
      if (!ptr) throw GrammarError("$ref " + target + " points to nothing", path, "$ref");
      b = ptr;
    }
    if (b->is_bool() && b->get_bool()) continue;
    if (!b->is_object()) throw GrammarError("allOf: a subschema that is not an object", path, "allOf");
    parts.push_back(b->get_object());
  }
  std::size_t with_props = 0;
  for (const auto& p : parts) with_props += p.contains("properties") || p.contains("additionalProperties");
  json::object merged;
  for (const auto& p : parts) {
    for (const auto& [key, v] : p) {
      if (kAnnotations.contains(key)) continue;
      if (key == "additionalProperties" && with_props > 1) {
        throw GrammarError("allOf: additionalProperties with properties in another subschema is not supported", path,
                           "additionalProperties");
      }
      if (key == "properties" && merged.contains("properties")) {
        auto& into = merged["properties"].as_object();
        for (const auto& [name, sub] : v.as_object()) {
          if (into.contains(name)) throw GrammarError("allOf: property '" + std::string(name) + "' in more than one subschema", path, "allOf");
          into[name] = sub;
        }
      } else if (key == "required" && merged.contains("required")) {
        for (const auto& r : v.as_array()) merged["required"].as_array().push_back(r);
      } else if (merged.contains(key)) {
        if (key == "type" && merged[key] == v) continue;
        throw GrammarError("allOf: keyword '" + std::string(key) + "' in more than one subschema", path, std::string(key));
      } else {
        merged[key] = v;
      }
    }
  }
  return merged;
}

Grammar json_schema_grammar(std::string_view schema_json, const GrammarOptions& options) {
  boost::system::error_code ec;
  const json::value schema = json::parse(schema_json, ec);
  if (ec) throw GrammarError("the JSON schema is not valid JSON: " + ec.message(), "#");
  SchemaConverter c(schema, options);
  ExprPtr root = c.convert(schema, "#");
  return c.take(root);
}

Grammar json_object_grammar(const GrammarOptions& options) {
  const json::value none;
  SchemaConverter c(none, options);
  ExprPtr root = c.any_object();
  return c.take(root);
}

}  // namespace kvfleet::grammar
