// /v1/chat/completions bodies: messages (roles, content strings or parts, tool calls), tools and
// tool_choice, each malformed field a 400 naming it ("messages[2].content[0].text").
#include <boost/json.hpp>

#include "engine/server/api/fields.h"
#include "engine/server/api/request.h"
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

void check_tools(const Fields& f) {
  const json::array* tools = f.array("tools");
  for (std::size_t i = 0; tools && i < tools->size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!(*tools)[i].is_object()) throw bad_request("'" + at + "' must be an object", at);
    const Fields tool((*tools)[i].as_object(), at + ".");
    if (tool.string("type").value_or("function") != "function")
      throw bad_request("only tools of type 'function' are supported", at + ".type");
    const json::object* fn = tool.object("function");
    if (!fn) throw bad_request("'" + at + ".function' is required", at + ".function");
    const Fields function(*fn, at + ".function.");
    const auto name = function.string("name");
    if (!name || name->empty()) throw bad_request("'" + at + ".function.name' is required", at + ".function.name");
    function.string("description");
    function.object("parameters");
    function.boolean("strict");
  }
  if (const json::value* choice = f.find("tool_choice")) {
    if (choice->is_string() && (choice->as_string() == "none" || choice->as_string() == "auto")) return;
    if (choice->is_string() || choice->is_object())
      throw bad_request("'tool_choice' other than 'none' or 'auto' is not supported", "tool_choice");
    throw bad_request("'tool_choice' must be 'none', 'auto' or an object", "tool_choice");
  }
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
  check_tools(f);
  if (const json::value* tools = f.find("tools")) r.tools = *tools;
  r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  f.boolean("parallel_tool_calls");
  r.params = parse_generate_params(body.as_object(), true);
  return r;
}

}  // namespace kvfleet::server
