// What a chat request's tool_choice asks of this replica, decided as vLLM decides it:
//   none     - tools reach the prompt, the answer is not parsed for calls;
//   auto     - (the default when tools are given) served with --enable-auto-tool-choice and a
//              --tool-call-parser, whose format the answer is parsed in; else a 400 that says so;
//   required - the grammar engine constrains the answer to a JSON list of calls, each
//              {"name": one of the tools, "parameters": that tool's parameters schema} (at least one; at most
//              one when parallel_tool_calls is false), read back as tool_calls;
//   named    - ({"type": "function", "function": {"name": ...}}) the answer is constrained to the named
//              tool's parameters schema and read back as one call of it.
// Forced answers are compact JSON (no whitespace between tokens, as OpenAI writes arguments): a model cannot
// spend its tokens on whitespace. Forced choices need no flag: the tools reach the prompt as for auto (the
// template's tools section, the --tool-call-parser's format, or else the tools listed as JSON).
#include <boost/json.hpp>

#include "engine/server/api/request.h"
#include "engine/server/replica.h"

namespace kvfleet::server {
namespace json = boost::json;

namespace {

const json::object& function_of(const json::value& tool) { return tool.as_object().at("function").as_object(); }

// A tool's parameters schema (an absent one: an object with no properties, i.e. `{}`).
json::value parameters_of(const json::value& tool) {
  if (const json::value* p = function_of(tool).if_contains("parameters"); p && !p->is_null()) return *p;
  return json::object{{"type", "object"}, {"properties", json::object{}}};
}

// Moves the schema's local references ("#/$defs/x") under `base`, where it is embedded in a larger schema.
void rebase_refs(json::value& schema, const std::string& base) {
  if (json::array* a = schema.if_array()) {
    for (auto& v : *a) rebase_refs(v, base);
    return;
  }
  json::object* o = schema.if_object();
  if (!o) return;
  for (auto& [key, value] : *o) {
    if (key == "$ref" && value.is_string() && value.as_string().starts_with("#"))
      value = base + std::string(value.as_string().subview(1));
    else
      rebase_refs(value, base);
  }
}

// required: [{"name": const, "parameters": schema} | ...], vLLM's shape.
json::object call_list_schema(const json::array& tools, bool parallel) {
  json::array branches;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    json::value params = parameters_of(tools[i]);
    rebase_refs(params, "#/items/anyOf/" + std::to_string(i) + "/properties/parameters");
    branches.push_back(json::object{
        {"type", "object"},
        {"properties", json::object{{"name", json::object{{"const", function_of(tools[i]).at("name")}}},
                                    {"parameters", std::move(params)}}},
        {"required", json::array{"name", "parameters"}},
        {"additionalProperties", false}});
  }
  json::object schema{{"type", "array"}, {"minItems", 1}, {"items", json::object{{"anyOf", std::move(branches)}}}};
  if (!parallel) schema["maxItems"] = 1;
  return schema;
}

}  // namespace

std::string tool_schema_param(const std::string& param) {
  // "tools.items.anyOf.3.properties.parameters.properties.x" -> "tools[3].function.parameters.properties.x"
  static constexpr std::string_view prefix = "tools.items.anyOf.", inner = ".properties.parameters";
  if (!std::string_view(param).starts_with(prefix)) return param;
  const std::size_t digits = param.find('.', prefix.size());
  if (digits == std::string::npos || std::string_view(param).substr(digits).rfind(inner, 0) != 0) return "tools";
  const std::string index = param.substr(prefix.size(), digits - prefix.size());
  return "tools[" + index + "].function.parameters" + param.substr(digits + inner.size());
}

Replica::ToolCallPlan Replica::plan_tool_calls(ChatRequest& r) const {
  const bool tools = r.tools.is_array() && !r.tools.as_array().empty();
  if (!tools) {
    if (r.tool_choice && r.tool_choice->mode != "none")
      throw bad_request("'tool_choice' needs 'tools'", "tool_choice");
    return {};
  }
  const json::array& list = r.tools.as_array();
  const std::string mode = r.tool_choice ? r.tool_choice->mode : "auto";
  if (mode == "none") return {};
  if (mode == "auto") {
    if (!config_.enable_auto_tool_choice || !tool_parser_)
      throw bad_request("\"auto\" tool choice requires the replica to run with --enable-auto-tool-choice and "
                        "--tool-call-parser",
                        "tool_choice");
    return {tool_parser_.get(), nullptr};
  }
  if (r.params.structured)
    throw bad_request("'" + r.params.structured->param + "' and a 'tool_choice' that forces a call both constrain the "
                          "answer; give one of them",
                      r.params.structured->param);
  StructuredOutput so;
  so.kind = StructuredOutput::Kind::json_schema;
  so.strict = true;
  so.compact = true;
  std::shared_ptr<const tools::ToolParser> forced;
  if (mode == "function") {
    std::optional<std::size_t> at;
    for (std::size_t i = 0; i < list.size() && !at; ++i)
      if (function_of(list[i]).at("name") == json::value(r.tool_choice->function)) at = i;
    if (!at)
      throw bad_request("'tool_choice' names the function '" + r.tool_choice->function + "', which is not in 'tools'",
                        "tool_choice");
    so.schema = parameters_of(list[*at]);
    so.param = so.schema_param = "tools[" + std::to_string(*at) + "].function.parameters";
    forced = tools::make_named_call_parser(r.tool_choice->function);
  } else {  // required
    so.schema = call_list_schema(list, r.parallel_tool_calls);
    so.param = so.schema_param = "tools";
    forced = tools::make_call_list_parser();
  }
  r.params.structured = std::move(so);
  return {forced.get(), forced};
}

}  // namespace kvfleet::server
