#include "kvfleet/chat_tools.h"

#include <boost/json.hpp>

namespace kvfleet::tools {
namespace json = boost::json;

json::value request_tools(const json::object& body) {
  if (const json::value* t = body.if_contains("tools"); t && !t->is_null()) return *t;
  const json::value* f = body.if_contains("functions");
  if (!f || !f->is_array()) return f ? *f : json::value();
  json::array tools;
  for (const auto& fn : f->as_array()) tools.push_back(json::object{{"type", "function"}, {"function", fn}});
  return tools;
}

bool template_renders_tools(const ChatTemplate& chat_template) {
  static constexpr std::string_view probe = "kvfleet_probe_tool_7f3a";
  const json::array messages{json::object{{"role", "user"}, {"content", "hello"}}};
  ChatTemplateOptions opts;
  opts.tools = json::array{json::object{
      {"type", "function"},
      {"function", json::object{{"name", probe}, {"description", "probe"},
                                {"parameters", json::object{{"type", "object"}, {"properties", json::object{}}}}}}}};
  try {
    return chat_template.render(messages, opts).find(probe) != std::string::npos;
  } catch (const std::exception&) {
    return false;
  }
}

namespace {

// tool_calls[].function.arguments given as JSON text -> that JSON (an object), as the templates expect;
// the calling message's null content -> "" (as vLLM passes it: Qwen's template tests `'</think>' in content`).
void arguments_as_objects(json::array& messages) {
  for (auto& m : messages) {
    json::value* calls = m.is_object() ? m.as_object().if_contains("tool_calls") : nullptr;
    if (!calls || !calls->is_array()) continue;
    if (const json::value* c = m.as_object().if_contains("content"); !c || c->is_null()) m.as_object()["content"] = "";
    for (auto& call : calls->as_array()) {
      json::value* fn = call.is_object() ? call.as_object().if_contains("function") : nullptr;
      json::value* args = fn && fn->is_object() ? fn->as_object().if_contains("arguments") : nullptr;
      if (!args || !args->is_string()) continue;
      json::error_code ec;
      json::value parsed = json::parse(args->as_string(), ec);
      if (!ec && parsed.is_object()) *args = std::move(parsed);
    }
  }
}

void add_to_system_message(json::array& messages, const std::string& text) {
  if (!messages.empty() && messages.front().is_object()) {
    json::object& first = messages.front().as_object();
    const json::value* role = first.if_contains("role");
    json::value* content = first.if_contains("content");
    if (role && role->is_string() && role->as_string() == "system" && content && content->is_string()) {
      *content = std::string(content->as_string()) + "\n\n" + text;
      return;
    }
  }
  messages.insert(messages.begin(), json::object{{"role", "system"}, {"content", text}});
}

}  // namespace

void prepare_chat_tools(json::array& messages, ChatTemplateOptions& opts, const json::value& tools,
                        bool template_renders, const ToolParser* parser) {
  arguments_as_objects(messages);
  const bool any = tools.is_array() && !tools.as_array().empty();
  if (!any) return;
  if (template_renders) {
    opts.tools = tools;
    return;
  }
  if (!parser)
    throw ToolsNotRenderable(
        "this model's chat template has no tools section, so the tools cannot reach the prompt; start the "
        "replica with --tool-call-parser to describe them in that parser's format");
  add_to_system_message(messages, parser->tools_prompt(tools.as_array()));
}

}  // namespace kvfleet::tools
