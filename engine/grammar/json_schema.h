// JSON Schema -> grammar IR (the keywords grammar.h lists). The converter keeps the shared JSON rules
// (whitespace, string, number, any value) and one rule per $ref target, so recursion works.
#pragma once

#include <boost/json.hpp>

#include <string>
#include <unordered_map>

#include "engine/grammar/grammar.h"
#include "engine/grammar/ir.h"

namespace kvfleet::grammar {

// Canonical compact JSON text (integral numbers without a fraction), as enum/const literals are written.
std::string canonical_json(const boost::json::value& v);

class SchemaConverter {
 public:
  SchemaConverter(const boost::json::value& root, const GrammarOptions& options);
  Grammar take(ExprPtr root_expr);

  ExprPtr convert(const boost::json::value& schema, const std::string& path);
  ExprPtr any_value() { return ref(value_rule_); }
  ExprPtr any_object() { return ref(object_rule_); }

 private:
  friend struct SchemaTypes;
  ExprPtr ws() { return ref(ws_rule_); }
  ExprPtr convert_object_schema(const boost::json::object& s, const std::string& path);
  ExprPtr typed(const boost::json::object& s, const std::string& type, const std::string& path);
  ExprPtr by_ref(const std::string& ref, const std::string& path);
  ExprPtr enum_values(const boost::json::object& s, const std::string& path);
  ExprPtr one_of(const boost::json::object& s, const std::string& path);
  boost::json::object merge_all_of(const boost::json::object& s, const std::string& path);
  int new_rule(const std::string& name) { return g_.add_rule(name); }

  const boost::json::value& root_;
  const GrammarOptions& options_;
  Grammar g_;
  int ws_rule_, char_rule_, string_rule_, number_rule_, integer_rule_, value_rule_, object_rule_, array_rule_;
  std::unordered_map<std::string, int> ref_rules_;
  std::size_t depth_ = 0;
};

// Per-type conversions (json_schema_types.cpp).
struct SchemaTypes {
  static ExprPtr string(SchemaConverter& c, const boost::json::object& s, const std::string& path);
  static ExprPtr number(SchemaConverter& c, const boost::json::object& s, const std::string& path, bool integer);
  static ExprPtr object(SchemaConverter& c, const boost::json::object& s, const std::string& path);
  static ExprPtr array(SchemaConverter& c, const boost::json::object& s, const std::string& path);
};

}  // namespace kvfleet::grammar
