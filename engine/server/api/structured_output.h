// Structured outputs (constrained decoding) in a request: OpenAI's `response_format` (json_object,
// json_schema), vLLM's `structured_outputs` {json, regex, choice, grammar, json_object} and its older
// `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, parsed into one plain struct. At most
// one constraint per request. A GrammarCompiler (the replica's grammar engine) turns it into the engine's
// TokenGrammar.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvfleet/token_constraint.h"

namespace kvfleet::server {

struct StructuredOutput {
  enum class Kind { json_object, json_schema, regex, choice, grammar };
  Kind kind = Kind::json_object;
  // The request field it came from ("response_format", "structured_outputs.regex", "guided_json"): the param
  // of a 400 about it.
  std::string param;
  // regex: the pattern; grammar: the grammar text (EBNF/GBNF); json_schema: the schema, serialized.
  std::string text;
  boost::json::value schema;         // json_schema: the schema (an object or a boolean)
  // json_schema: the field that holds the schema ("response_format.json_schema.schema", "guided_json"); a
  // compiler names a keyword it refuses below it ("response_format.json_schema.schema.properties.x.pattern").
  std::string schema_param;
  std::vector<std::string> choices;  // choice: the output is exactly one of these
  // JSON kinds: no whitespace between tokens (a forced tool call's arguments, compact as OpenAI writes them);
  // otherwise a short run of whitespace is allowed between tokens.
  bool compact = false;
  // response_format's json_schema: its name, description and strict flag (the schema is enforced either way).
  std::string name, description;
  bool strict = false;
};

const char* to_string(StructuredOutput::Kind kind);

// The request's constraint, or none (no field, response_format text, an empty structured_outputs). Throws
// ApiError 400 naming the field for a malformed one, for a field kvfleet does not implement (vLLM's
// structural_tag, whitespace_pattern, ...) and for a second constraint. `guided_decoding_backend` is accepted
// and ignored: the replica has one grammar engine (vLLM chooses the backend per server too).
std::optional<StructuredOutput> parse_structured_output(const boost::json::object& body);

// Thrown by a GrammarCompiler for a constraint it cannot compile (a keyword it does not support, a regex that
// does not parse, a schema over its size or time bound): a 400 whose param is `param` (e.g.
// "response_format.json_schema.schema.properties.x.pattern"), or the constraint's own field when empty.
struct StructuredOutputError : std::invalid_argument {
  StructuredOutputError(const std::string& message, std::string param_ = {})
      : std::invalid_argument(message), param(std::move(param_)) {}
  std::string param;
};

// Compiles a constraint into a grammar over the replica's vocabulary (its stop tokens: the model's end-of-
// sequence ids). Runs on the replica's compile thread, never on the engine thread or an HTTP thread, and may
// take its time. Throws StructuredOutputError (or std::invalid_argument) for a constraint it refuses.
using GrammarCompiler = std::function<std::shared_ptr<const TokenGrammar>(const StructuredOutput&)>;

}  // namespace kvfleet::server
