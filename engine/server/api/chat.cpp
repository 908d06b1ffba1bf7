// /v1/chat/completions bodies: messages (roles, content strings or parts, tool calls), tools and
// tool_choice, each malformed field a 400 naming it ("messages[2].content[0].text").
#include <boost/json.hpp>

#include "engine/server/api/fields.h"
#include "engine/server/api/request.h"
#include "engine/server/api/unimplemented_fields.h"
#include "kvfleet/chat_content.h"

namespace kvfleet::server {
namespace json = boost::json;

namespace {

bool known_role(std::string_view role) {
  return role == "system" || role == "developer" || role == "user" || role == "assistant" || role == "tool" ||
         role == "function";
}

void check_tool_calls(const Fields& m, const std::string& where) {
  const json::array* calls = m.array("tool_calls");
  if (!calls) return;
  for (std::size_t k = 0; k < calls->size(); ++k) {
    const std::string at = where + "tool_calls[" + std::to_string(k) + "]";
    if (!(*calls)[k].is_object()) throw bad_request("'" + at + "' must be an object", at);
    const Fields call((*calls)[k].as_object(), at + ".");
    call.string("id");
    call.string("type");
    const json::object* fn = call.object("function");
    if (!fn) throw bad_request("'" + at + ".function' is required", at + ".function");
    const Fields function(*fn, at + ".function.");
    if (!function.string("name")) throw bad_request("'" + at + ".function.name' is required", at + ".function.name");
    const json::value* args = function.find("arguments");
    if (args && !args->is_string() && !args->is_object())
      throw bad_request("'" + at + ".function.arguments' must be a string", at + ".function.arguments");
  }
}

json::object parse_message(const json::value& m, std::size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) throw bad_request("'" + where + "' must be an object", where);
  const Fields f(m.as_object(), where + ".");
  const auto role = f.string("role");
  if (!role) throw bad_request("'" + where + ".role' is required", where + ".role");
  if (!known_role(*role)) throw bad_request("unknown role '" + *role + "'", where + ".role");
  json::object msg = m.as_object();
  const json::value* c = f.find("content");
  if (c && c->is_array()) {
    try {
      msg["content"] = join_content_parts(c->as_array(), where + ".content");
    } catch (const ContentPartError& e) {
      throw bad_request(e.what(), e.param);
    }
  } else if (c && !c->is_string()) {
    throw bad_request("'" + where + ".content' must be a string or a list of text parts", where + ".content");
  } else if (!c && *role != "assistant") {
    throw bad_request("'" + where + ".content' is required for role '" + *role + "'", where + ".content");
  }
  f.string("name");
  f.string("tool_call_id");
  f.string("reasoning_content");
  check_tool_calls(f, where + ".");
  return msg;
}

void check_tools(const json::array& tools, const std::string& name) {
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const std::string at = name + "[" + std::to_string(i) + "]";
    if (!tools[i].is_object()) throw bad_request("'" + at + "' must be an object", at);
    const Fields tool(tools[i].as_object(), at + ".");
    if (tool.string("type").value_or("function") != "function")
      throw bad_request("only tools of type 'function' are supported", at + ".type");
    const json::object* fn = tool.object("function");
    if (!fn) throw bad_request("'" + at + ".function' is required", at + ".function");
    const Fields function(*fn, at + ".function.");
    const auto fname = function.string("name");
    if (!fname || fname->empty()) throw bad_request("'" + at + ".function.name' is required", at + ".function.name");
    function.string("description");
    function.object("parameters");
    function.boolean("strict");
  }
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}; the legacy
// function_call: "none" | "auto" | {"name": ...}.
std::optional<ToolChoice> parse_tool_choice(const Fields& f) {
  const char* key = f.find("tool_choice") ? "tool_choice" : f.find("function_call") ? "function_call" : nullptr;
  if (!key) return std::nullopt;
  const std::string param = key;
  const json::value& choice = *f.find(key);
  const bool legacy = param == "function_call";
  if (choice.is_string()) {
    const std::string mode(choice.as_string());
    if (mode == "none" || mode == "auto" || (!legacy && mode == "required")) return ToolChoice{mode, {}};
  } else if (choice.is_object()) {
    const json::object* fn = &choice.as_object();
    if (!legacy) {
      const Fields c(choice.as_object(), param + ".");
      if (c.string("type").value_or("function") != "function")
        throw bad_request("'" + param + ".type' must be 'function'", param + ".type");
      fn = c.object("function");
      if (!fn) throw bad_request("'" + param + ".function' is required", param + ".function");
    }
    const std::string at = legacy ? param + "." : param + ".function.";
    const auto name = Fields(*fn, at).string("name");
    if (!name || name->empty()) throw bad_request("'" + at + "name' is required", at + "name");
    return ToolChoice{"function", *name};
  }
  throw bad_request(legacy ? "'function_call' must be 'none', 'auto' or {\"name\": ...}"
                           : "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                             "\"function\": {\"name\": ...}}",
                    param);
}

void parse_tools(const Fields& f, ChatRequest& r) {
  if (f.find("tools") && f.find("functions"))
    throw bad_request("give 'tools' or the legacy 'functions', not both", "functions");
  if (f.find("tool_choice") && f.find("function_call"))
    throw bad_request("give 'tool_choice' or the legacy 'function_call', not both", "function_call");
  const char* key = f.find("functions") ? "functions" : "tools";
  if (const json::array* list = f.array(key)) {
    if (std::string_view(key) == "functions") {
      json::array tools;
      for (std::size_t i = 0; i < list->size(); ++i) {
        const std::string at = "functions[" + std::to_string(i) + "]";
        if (!(*list)[i].is_object()) throw bad_request("'" + at + "' must be an object", at);
        tools.push_back(json::object{{"type", "function"}, {"function", (*list)[i]}});
      }
      check_tools(tools, "functions");  // (names tools[i].function.x as functions[i].function.x)
      r.tools = std::move(tools);
    } else {
      check_tools(*list, "tools");
      r.tools = *list;
    }
  }
  r.tool_choice = parse_tool_choice(f);
  r.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
}

}  // namespace

ChatRequest parse_chat_request(const json::value& body) {
  const Fields f(body.as_object());
  ChatRequest r;
  r.model = f.string("model").value_or("");
  const json::value* messages = f.find("messages");
  if (!messages || !messages->is_array() || messages->as_array().empty())
    throw bad_request("'messages' must be a non-empty list of messages", "messages");
  const json::array& list = messages->as_array();
  for (std::size_t i = 0; i < list.size(); ++i) r.messages.push_back(parse_message(list[i], i));
  refuse_unimplemented_fields(body.as_object(), Endpoint::chat);
  parse_tools(f, r);
  r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  r.params = parse_generate_params(body.as_object(), true);
  return r;
}

}  // namespace kvfleet::server
