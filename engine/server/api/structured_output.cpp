#include "engine/server/api/structured_output.h"

#include <boost/json.hpp>
#include <algorithm>

#include "engine/server/api/fields.h"
#include "engine/server/api/request.h"

namespace kvfleet::server {
namespace json = boost::json;

const char* to_string(StructuredOutput::Kind kind) {
  switch (kind) {
    case StructuredOutput::Kind::json_object: return "json_object";
    case StructuredOutput::Kind::json_schema: return "json_schema";
    case StructuredOutput::Kind::regex: return "regex";
    case StructuredOutput::Kind::choice: return "choice";
    case StructuredOutput::Kind::grammar: return "grammar";
  }
  return "?";
}

namespace {

using Kind = StructuredOutput::Kind;

StructuredOutput make(Kind kind, std::string param) {
  StructuredOutput s;
  s.kind = kind;
  s.param = std::move(param);
  return s;
}

void refuse_unknown(const json::object& o, std::initializer_list<std::string_view> known, const std::string& prefix) {
  for (const auto& [key, value] : o)
    if (std::find(known.begin(), known.end(), std::string_view(key)) == known.end())
      throw bad_request("'" + prefix + std::string(key) + "' is not supported", prefix + std::string(key));
}

// A JSON schema: an object or a boolean, or (vLLM's guided_json and structured_outputs.json) a string
// holding one.
StructuredOutput schema_from(const json::value& v, const std::string& param) {
  StructuredOutput s = make(Kind::json_schema, param);
  if (v.is_string()) {
    json::error_code ec;
    s.schema = json::parse(v.as_string(), ec);
    if (ec) throw bad_request("'" + param + "' is not valid JSON: " + ec.message(), param);
  } else {
    s.schema = v;
  }
  if (!s.schema.is_object() && !s.schema.is_bool())
    throw bad_request("'" + param + "' must be a JSON schema (an object)", param);
  s.text = json::serialize(s.schema);
  s.schema_param = param;
  return s;
}

StructuredOutput text_of(const json::value& v, Kind kind, const std::string& param) {
  if (!v.is_string() || v.as_string().empty()) throw bad_request("'" + param + "' must be a non-empty string", param);
  StructuredOutput s = make(kind, param);
  s.text = std::string(v.as_string());
  return s;
}

StructuredOutput choices_of(const json::value& v, const std::string& param) {
  if (!v.is_array() || v.as_array().empty())
    throw bad_request("'" + param + "' must be a non-empty list of strings", param);
  StructuredOutput s = make(Kind::choice, param);
  for (const auto& c : v.as_array()) {
    if (!c.is_string()) throw bad_request("'" + param + "' must be a non-empty list of strings", param);
    s.choices.emplace_back(c.as_string());
  }
  return s;
}

// OpenAI's response_format: {type: text | json_object | json_schema, json_schema: {name, schema, strict, description}}.
std::optional<StructuredOutput> from_response_format(const Fields& body) {
  const json::object* format = body.object("response_format");
  if (!format) return std::nullopt;
  const Fields f(*format, "response_format.");
  const auto type = f.string("type");
  if (!type) throw bad_request("'response_format.type' is required", "response_format.type");
  if (*type == "text") {
    refuse_unknown(*format, {"type"}, "response_format.");
    return std::nullopt;
  }
  if (*type == "json_object") {
    refuse_unknown(*format, {"type"}, "response_format.");
    return make(Kind::json_object, "response_format");
  }
  if (*type != "json_schema")
    throw bad_request("'response_format.type' must be 'text', 'json_object' or 'json_schema', got '" + *type + "'",
                      "response_format.type");
  refuse_unknown(*format, {"type", "json_schema"}, "response_format.");
  const json::object* js = f.object("json_schema");
  if (!js) throw bad_request("'response_format.json_schema' is required for type 'json_schema'", "response_format.json_schema");
  const std::string at = "response_format.json_schema.";
  refuse_unknown(*js, {"name", "schema", "strict", "description"}, at);
  const Fields g(*js, at);
  const json::value* schema = g.find("schema");
  if (!schema) throw bad_request("'" + at + "schema' is required", at + "schema");
  if (schema->is_string()) throw bad_request("'" + at + "schema' must be a JSON schema (an object)", at + "schema");
  StructuredOutput s = schema_from(*schema, at + "schema");
  s.param = "response_format";
  const auto name = g.string("name");
  if (!name || name->empty() || name->size() > 64 ||
      name->find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
    throw bad_request("'" + at + "name' is required: 1 to 64 letters, digits, '_' or '-'", at + "name");
  s.name = *name;
  s.description = g.string("description").value_or("");
  s.strict = g.boolean("strict").value_or(false);
  return s;
}

// vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object.
std::optional<StructuredOutput> from_structured_outputs(const Fields& body) {
  const json::object* so = body.object("structured_outputs");
  if (!so) return std::nullopt;
  const std::string at = "structured_outputs.";
  const Fields f(*so, at);
  // vLLM's knobs kvfleet does not implement: refused when they ask for something, accepted at their default.
  for (const char* flag : {"disable_additional_properties", "disable_fallback"})
    if (f.boolean(flag).value_or(false)) throw bad_request("'" + at + flag + "' is not supported", at + flag);
  for (const char* field : {"whitespace_pattern", "structural_tag"})
    if (f.find(field)) throw bad_request("'" + at + field + "' is not supported", at + field);
  refuse_unknown(*so, {"json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace",
                       "disable_additional_properties", "disable_fallback", "whitespace_pattern", "structural_tag"}, at);
  std::optional<StructuredOutput> out;
  auto take = [&](StructuredOutput s) {
    if (out) throw bad_request("'structured_outputs' may hold only one of json, regex, choice, grammar and json_object; "
                               "it has '" + out->param.substr(at.size()) + "' and '" + s.param.substr(at.size()) + "'",
                               s.param);
    out = std::move(s);
  };
  if (const json::value* v = f.find("json")) take(schema_from(*v, at + "json"));
  if (const json::value* v = f.find("regex")) take(text_of(*v, Kind::regex, at + "regex"));
  if (const json::value* v = f.find("choice")) take(choices_of(*v, at + "choice"));
  if (const json::value* v = f.find("grammar")) take(text_of(*v, Kind::grammar, at + "grammar"));
  if (f.boolean("json_object").value_or(false)) take(make(Kind::json_object, at + "json_object"));
  // disable_any_whitespace: compact JSON, no whitespace between tokens (a small model cannot pad the answer
  // with spaces until max_tokens). JSON only: a regex, choice or grammar says its own whitespace.
  if (f.boolean("disable_any_whitespace").value_or(false)) {
    if (!out || (out->kind != Kind::json_schema && out->kind != Kind::json_object))
      throw bad_request("'" + at + "disable_any_whitespace' applies to json and json_object only",
                        at + "disable_any_whitespace");
    out->compact = true;
  }
  return out;
}

}  // namespace

std::optional<StructuredOutput> parse_structured_output(const json::object& body) {
  const Fields f(body);
  std::optional<StructuredOutput> out;
  auto take = [&](std::optional<StructuredOutput> s) {
    if (!s) return;
    if (out)
      throw bad_request("a request may ask for one structured output only: '" + out->param + "' and '" + s->param +
                            "' both do", s->param);
    out = std::move(s);
  };
  take(from_response_format(f));
  take(from_structured_outputs(f));
  if (const json::value* v = f.find("guided_json")) take(schema_from(*v, "guided_json"));
  if (const json::value* v = f.find("guided_regex")) take(text_of(*v, Kind::regex, "guided_regex"));
  if (const json::value* v = f.find("guided_choice")) take(choices_of(*v, "guided_choice"));
  if (const json::value* v = f.find("guided_grammar")) take(text_of(*v, Kind::grammar, "guided_grammar"));
  if (f.find("guided_whitespace_pattern")) throw bad_request("'guided_whitespace_pattern' is not supported", "guided_whitespace_pattern");
  f.string("guided_decoding_backend");  // accepted, ignored: one grammar engine per replica
  return out;
}

}  // namespace kvfleet::server
