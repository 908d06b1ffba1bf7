// Runs the official JSON Schema Test Suite (npm json-schema-test-suite, tests/<draft>/*.json) against the
// grammar engine's JSON Schema front end: each suite schema is compiled to a byte-level grammar or refused
// (a GrammarError naming the keyword); a compiled grammar must accept the suite's valid instances and must
// reject its invalid ones. An instance is tried as compact JSON with its object keys in the document's
// order and, when that is refused, with keys in the order of the schema's `properties` (the grammar emits
// properties in schema order). Used by bench/schema_coverage.cpp (the full report) and the grammar tests
// (a handful of files).
#pragma once

#include <boost/json.hpp>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/grammar/grammar.h"

namespace kvfleet::grammar::suite {

struct InstanceResult {
  std::string description;
  std::string data;  // compact JSON
  bool valid = false;     // what the suite says
  bool accepted = false;  // what the grammar says
};

struct SchemaResult {
  std::string file;  // the suite file's stem: the keyword it tests ("maxLength")
  std::string description;
  std::string schema;  // compact JSON
  bool compiled = false;
  std::string refused_keyword;  // when refused: the keyword the error names ("" when it names none)
  std::string error;
  std::vector<InstanceResult> instances;

  // An invalid instance the grammar accepts: the grammar lets through output that violates the schema.
  int violations() const {
    int n = 0;
    for (const auto& i : instances) n += !i.valid && i.accepted;
    return n;
  }
  // A valid instance the grammar refuses: the grammar is narrower than the schema there.
  int narrower() const {
    int n = 0;
    for (const auto& i : instances) n += i.valid && !i.accepted;
    return n;
  }
};

// `value` with the keys of every object reordered to follow `schema`'s properties (recursively through
// properties, allOf's properties, items and additionalProperties); keys the schema does not list keep their order, after.
inline boost::json::value schema_ordered(const boost::json::value& value, const boost::json::value& schema) {
  const auto* s = schema.if_object();
  if (!s) return value;
  if (const auto* arr = value.if_array()) {
    const auto* items = s->if_contains("items");
    boost::json::array out;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const boost::json::value* sub = nullptr;
      if (items && items->is_object()) sub = items;
      else if (items && items->is_array() && i < items->as_array().size()) sub = &items->as_array()[i];
      out.push_back(sub ? schema_ordered((*arr)[i], *sub) : (*arr)[i]);
    }
    return out;
  }
  const auto* obj = value.if_object();
  if (!obj) return value;
  const auto* additional = s->if_contains("additionalProperties");
  boost::json::object out;
  std::vector<const boost::json::value*> with_properties{&schema};  // allOf's branches add theirs, in order
  if (const auto* all = s->if_contains("allOf"); all && all->is_array()) {
    for (const auto& b : all->as_array()) with_properties.push_back(&b);
  }
  for (const auto* w : with_properties) {
    const auto* props = w->is_object() ? w->as_object().if_contains("properties") : nullptr;
    if (!props || !props->is_object()) continue;
    for (const auto& [key, sub] : props->as_object()) {
      if (const auto* v = obj->if_contains(key); v && !out.contains(key)) out[key] = schema_ordered(*v, sub);
    }
  }
  for (const auto& [key, v] : *obj) {
    if (!out.contains(key)) out[key] = additional ? schema_ordered(v, *additional) : v;
  }
  return out;
}

// Compact JSON; a double in its shortest round-trip form, keeping a fraction ("1.0", "2.5", not "2.5E0")
// so an instance reads as the suite wrote it.
inline void write_json(const boost::json::value& v, std::string& out) {
  switch (v.kind()) {
    case boost::json::kind::double_: {
      char buf[64];
      const auto r = std::to_chars(buf, buf + sizeof buf, v.get_double());
      std::string num(buf, r.ptr);
      if (num.find_first_of(".eEn") == std::string::npos) num += ".0";
      out += num;
      return;
    }
    case boost::json::kind::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v.get_array()) {
        if (!first) out += ',';
        first = false;
        write_json(e, out);
      }
      out += ']';
      return;
    }
    case boost::json::kind::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.get_object()) {
        if (!first) out += ',';
        first = false;
        out += boost::json::serialize(boost::json::string(k));
        out += ':';
        write_json(e, out);
      }
      out += '}';
      return;
    }
    default: out += boost::json::serialize(v);
  }
}
inline std::string to_json(const boost::json::value& v) {
  std::string out;
  write_json(v, out);
  return out;
}

inline bool grammar_accepts(const GrammarSpec& spec, const GrammarOptions& options, const std::string& text) {
  auto m = compile_bytes(spec, options);
  return m->feed(text) && m->can_end();
}

// Every schema of one suite file (a JSON array of {description, schema, tests: [{description, data, valid}]}).
inline std::vector<SchemaResult> run_file(const std::string& path, const GrammarOptions& options) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const boost::json::value doc = boost::json::parse(text.str());
  std::string stem = path.substr(path.find_last_of('/') + 1);
  stem = stem.substr(0, stem.rfind(".json"));
  std::vector<SchemaResult> results;
  for (const auto& group : doc.as_array()) {
    SchemaResult r;
    r.file = stem;
    r.description = std::string(group.at("description").as_string());
    r.schema = to_json(group.at("schema"));
    const GrammarSpec spec{GrammarKind::json_schema, r.schema, {}};
    try {
      compile_bytes(spec, options);
      r.compiled = true;
    } catch (const GrammarError& e) {
      r.refused_keyword = e.keyword();
      r.error = e.what();
    }
    for (const auto& t : group.at("tests").as_array()) {
      InstanceResult i;
      i.description = std::string(t.at("description").as_string());
      i.data = to_json(t.at("data"));
      i.valid = t.at("valid").as_bool();
      if (r.compiled) {
        i.accepted = grammar_accepts(spec, options, i.data);
        if (!i.accepted) {
          const std::string reordered = to_json(schema_ordered(t.at("data"), group.at("schema")));
          if (reordered != i.data) i.accepted = grammar_accepts(spec, options, reordered);
        }
      }
      r.instances.push_back(std::move(i));
    }
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace kvfleet::grammar::suite
