#include "engine/server/api/responses.h"

#include <boost/json.hpp>

#include "engine/server/api/fields.h"
#include "engine/server/api/request.h"
#include "kvfleet/responses_input.h"

namespace kvfleet::server {
namespace json = boost::json;

namespace {

constexpr std::size_t kMaxMetadataEntries = 16, kMaxMetadataKey = 64, kMaxMetadataValue = 512;

// Fields of the chat completions body that mean the same on /v1/responses (OpenAI's temperature and
// top_p; vLLM's and SGLang's sampling extras), passed on as they are and validated by the chat parser.
constexpr const char* kPassedToChat[] = {"temperature", "top_p", "seed", "top_k", "min_p", "presence_penalty",
                                         "frequency_penalty", "repetition_penalty", "stop", "stop_token_ids",
                                         "ignore_eos", "skip_special_tokens", "logit_bias", "cache_salt",
                                         "data_parallel_rank", "user", "priority"};

// Chat completions fields that have another name, or no place, on /v1/responses: refused rather than
// dropped, so that a client mixing the two APIs learns it at once.
struct ChatOnly {
  const char* field;
  const char* instead;
};
constexpr ChatOnly kChatOnly[] = {
    {"messages", "use 'input' (a string or a list of input items)"},
    {"max_tokens", "use 'max_output_tokens'"},
    {"max_completion_tokens", "use 'max_output_tokens'"},
    {"response_format", "use 'text.format'"},
    {"n", "a response has one output"},
    {"logprobs", "not served on /v1/responses"},
    {"functions", "use 'tools' with function tools"},
    {"function_call", "use 'tool_choice'"},
    {"best_of", "a response has one output"},
    {"echo", "not a Responses API field"},
    {"suffix", "not a Responses API field"},
};

void refuse_unserved(const Fields& f) {
  for (const auto& c : kChatOnly)
    if (f.find(c.field)) throw bad_request("'" + std::string(c.field) + "' is not a Responses API field: " + c.instead, c.field);
  if (f.boolean("background").value_or(false))
    throw bad_request("background responses are not supported: send the request and wait for it (or stream it)",
                      "background");
  if (f.find("conversation"))
    throw bad_request("conversations are not supported: continue with 'previous_response_id'", "conversation");
  if (f.find("prompt")) throw bad_request("reusable prompts ('prompt') are not supported: send 'input'", "prompt");
  if (const json::array* include = f.array("include"); include && !include->empty())
    throw bad_request("'include' values are not served by this server (none are supported)", "include");
  if (f.integer("top_logprobs", 0, 20).value_or(0) > 0)
    throw bad_request("'top_logprobs' is not served on /v1/responses", "top_logprobs");
  if (auto tier = f.string("service_tier"); tier && *tier != "auto" && *tier != "default")
    throw bad_request("'service_tier' '" + *tier + "' is not supported (auto or default)", "service_tier");
}

void check_reasoning(const Fields& f, json::object& echo) {
  const json::object* reasoning = f.object("reasoning");
  echo["reasoning"] = json::object{{"effort", nullptr}, {"summary", nullptr}};
  if (!reasoning) return;
  const Fields r(*reasoning, "reasoning.");
  // The reasoning (with a reasoning parser) is what the model writes: a setting would change nothing, so
  // it is refused (as OpenAI refuses it for a model without reasoning settings).
  for (const char* key : {"effort", "summary", "generate_summary"})
    if (r.find(key)) throw bad_request("'reasoning." + std::string(key) + "' is not supported by this model", r.name(key));
}

json::object parse_text(const Fields& f, const ResponsesCapabilities& can, json::object& chat) {
  json::object text{{"format", json::object{{"type", "text"}}}, {"verbosity", "medium"}};
  const json::object* given = f.object("text");
  if (!given) return text;
  const Fields t(*given, "text.");
  if (auto verbosity = t.string("verbosity"); verbosity && *verbosity != "medium")
    throw bad_request("'text.verbosity' other than 'medium' is not supported", "text.verbosity");
  const json::object* format = t.object("format");
  if (!format) return text;
  const auto type = Fields(*format, "text.format.").string("type");
  if (!type) throw bad_request("'text.format.type' is required", "text.format.type");
  if (*type == "text") return text;
  if (*type != "json_object" && *type != "json_schema")
    throw bad_request("unknown 'text.format.type' '" + *type + "' (text, json_object or json_schema)", "text.format.type");
  if (!can.structured_outputs)
    throw bad_request("'text.format' of type '" + *type + "' needs structured outputs, which this server does not serve",
                      "text.format");
  // The chat body's response_format: json_schema's name/schema/strict move under "json_schema".
  json::object rf{{"type", *type}};
  if (*type == "json_schema") {
    json::object schema;  // (a copy without "type", in the given order)
    for (const auto& [key, value] : *format)
      if (key != "type") schema[key] = value;
    rf["json_schema"] = std::move(schema);
  }
  chat["response_format"] = std::move(rf);
  text["format"] = *format;
  return text;
}

// Responses function tools are flat ({type, name, parameters}); chat's nest them under "function".
json::array parse_tools(const Fields& f, json::array& echo) {
  json::array chat_tools;
  const json::array* tools = f.array("tools");
  for (std::size_t i = 0; tools && i < tools->size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!(*tools)[i].is_object()) throw bad_request("'" + at + "' must be an object", at);
    json::object chat_tool;
    try {
      chat_tool = responses_chat_tool((*tools)[i].as_object(), at);
    } catch (const ContentPartError& e) {
      throw bad_request(e.what(), e.param);
    }
    const json::object& fn = chat_tool.at("function").as_object();
    const auto field = [&](const char* key) { return fn.contains(key) ? fn.at(key) : json::value(nullptr); };
    echo.push_back(json::object{{"type", "function"}, {"name", fn.at("name")}, {"description", field("description")},
                                {"parameters", field("parameters")},
                                {"strict", fn.contains("strict") ? fn.at("strict") : json::value(true)}});
    chat_tools.push_back(std::move(chat_tool));
  }
  return chat_tools;
}

// tool_choice: "none" | "auto" | "required" | {type: "function", name}.
json::value parse_tool_choice(const Fields& f, bool has_tools, const ResponsesCapabilities& can) {
  const json::value* choice = f.find("tool_choice");
  if (!choice) return "auto";
  bool forced = false;  // required, or a named function
  if (choice->is_string()) {
    const std::string_view c = choice->as_string();
    if (c != "none" && c != "auto" && c != "required")
      throw bad_request("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
                        "tool_choice");
    forced = c == "required";
  } else if (choice->is_object()) {
    const Fields c(choice->as_object(), "tool_choice.");
    const auto type = c.string("type");
    if (type != "function")
      throw bad_request("'tool_choice' of type '" + type.value_or("") + "' is not supported (only 'function')",
                        "tool_choice.type");
    if (!c.string("name")) throw bad_request("'tool_choice.name' is required", "tool_choice.name");
    forced = true;
  } else {
    throw bad_request("'tool_choice' must be a string or an object", "tool_choice");
  }
  if (forced && !has_tools) throw bad_request("'tool_choice' names a tool call but 'tools' is empty", "tool_choice");
  if (forced && !can.tool_calls)
    throw bad_request("'tool_choice' that forces a call needs tool calling, which this server does not serve", "tool_choice");
  return *choice;
}

json::object parse_metadata(const Fields& f) {
  const json::object* metadata = f.object("metadata");
  if (!metadata) return {};
  if (metadata->size() > kMaxMetadataEntries)
    throw bad_request("'metadata' may hold at most 16 entries", "metadata");
  for (const auto& [key, value] : *metadata) {
    if (key.size() > kMaxMetadataKey) throw bad_request("'metadata' keys may be at most 64 characters", "metadata");
    if (!value.is_string() || value.as_string().size() > kMaxMetadataValue)
      throw bad_request("'metadata' values must be strings of at most 512 characters", "metadata");
  }
  return *metadata;
}

void parse_stream(const Fields& f, ResponsesRequest& r) {
  r.stream = f.boolean("stream").value_or(false);
  const json::object* options = f.object("stream_options");
  if (!options) return;
  if (!r.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
  if (Fields(*options, "stream_options.").boolean("include_obfuscation").value_or(false))
    throw bad_request("'stream_options.include_obfuscation' is not supported", "stream_options.include_obfuscation");
}

json::value optional_string(const Fields& f, const char* key) {
  auto s = f.string(key);
  return s ? json::value(*s) : json::value(nullptr);
}

}  // namespace

ResponsesRequest parse_responses_request(const json::value& body, const ResponsesCapabilities& can) {
  const Fields f(body.as_object());
  ResponsesRequest r;
  refuse_unserved(f);
  r.model = f.string("model").value_or("");
  const json::value* input = f.find("input");
  if (!input) throw bad_request("'input' is required", "input");
  try {
    r.input = responses_input_items(*input);
  } catch (const ContentPartError& e) {
    throw bad_request(e.what(), e.param);
  }
  r.instructions = f.string("instructions");
  r.previous_response_id = f.string("previous_response_id");
  r.store = f.boolean("store").value_or(true);
  parse_stream(f, r);
  const auto truncation = f.string("truncation").value_or("disabled");
  if (truncation != "disabled" && truncation != "auto")
    throw bad_request("'truncation' must be 'disabled' or 'auto'", "truncation");
  r.truncate = truncation == "auto";

  json::object& chat = r.chat;
  for (const char* key : kPassedToChat)
    if (const json::value* v = f.find(key)) chat[key] = *v;
  chat["model"] = r.model;
  const auto max_output = f.integer("max_output_tokens", 1, INT32_MAX);
  if (max_output) chat["max_tokens"] = *max_output;
  chat["stream"] = r.stream;
  if (r.stream) chat["stream_options"] = json::object{{"include_usage", true}};

  json::object& echo = r.echo;
  json::array echo_tools;
  json::array chat_tools = parse_tools(f, echo_tools);
  const json::value tool_choice = parse_tool_choice(f, !chat_tools.empty(), can);
  const bool calls_allowed = !(tool_choice.is_string() && tool_choice.as_string() == "none");
  if (!chat_tools.empty() && calls_allowed && !can.tool_calls)
    throw bad_request("function tools need tool calling, which this server does not serve (tool_choice 'none' renders "
                      "them without calls)", "tools");
  const auto parallel = f.boolean("parallel_tool_calls");
  if (!chat_tools.empty()) {
    chat["tools"] = std::move(chat_tools);
    // A named function: Responses names it flat ({type, name}), chat nests it ({type, function: {name}}).
    chat["tool_choice"] = tool_choice.is_object()
                              ? json::value(json::object{{"type", "function"},
                                                         {"function", json::object{{"name", tool_choice.at("name")}}}})
                              : tool_choice;
    if (parallel) chat["parallel_tool_calls"] = *parallel;
  }
  const auto max_tool_calls = f.integer("max_tool_calls", 1, INT32_MAX);
  // A bound on calls holds trivially while no call can be made; with tool calling it is not enforced.
  if (max_tool_calls && can.tool_calls)
    throw bad_request("'max_tool_calls' is not supported", "max_tool_calls");
  check_reasoning(f, echo);
  echo["text"] = parse_text(f, can, chat);
  echo["instructions"] = r.instructions ? json::value(*r.instructions) : json::value(nullptr);
  echo["max_output_tokens"] = max_output ? json::value(*max_output) : json::value(nullptr);
  echo["max_tool_calls"] = max_tool_calls ? json::value(*max_tool_calls) : json::value(nullptr);
  echo["metadata"] = parse_metadata(f);
  echo["parallel_tool_calls"] = parallel.value_or(true);
  echo["previous_response_id"] = r.previous_response_id ? json::value(*r.previous_response_id) : json::value(nullptr);
  echo["prompt_cache_key"] = optional_string(f, "prompt_cache_key");
  echo["safety_identifier"] = optional_string(f, "safety_identifier");
  echo["service_tier"] = "default";
  echo["store"] = r.store;
  echo["temperature"] = f.number("temperature", 0.0, 2.0).value_or(1.0);
  echo["tool_choice"] = tool_choice;
  echo["tools"] = std::move(echo_tools);
  echo["top_logprobs"] = 0;
  echo["top_p"] = f.number("top_p", 0.0, 1.0).value_or(1.0);
  echo["truncation"] = truncation;
  echo["user"] = optional_string(f, "user");
  echo["background"] = false;
  return r;
}

std::string responses_param(const std::string& chat_param) {
  if (chat_param == "max_tokens") return "max_output_tokens";
  if (chat_param.rfind("messages", 0) == 0) return "input";
  if (chat_param.rfind("response_format", 0) == 0) return "text.format";
  return chat_param;
}

}  // namespace kvfleet::server
