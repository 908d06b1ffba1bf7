#include "kvfleet/responses_input.h"

#include <boost/json.hpp>

namespace kvfleet {
namespace json = boost::json;

namespace {

[[noreturn]] void fail(const std::string& message, const std::string& param) { throw ContentPartError(message, param); }

const json::string* string_field(const json::object& o, const char* key, const std::string& at, bool required) {
  const json::value* v = o.if_contains(key);
  const std::string name = at + "." + key;
  if (!v || v->is_null()) {
    if (required) fail("'" + name + "' is required", name);
    return nullptr;
  }
  if (!v->is_string()) fail("'" + name + "' must be a string", name);
  return &v->as_string();
}

bool media_part(std::string_view type) {
  return type == "input_image" || type == "input_file" || type == "input_audio" || type == "image_url" ||
         type == "file" || type == "input_video";
}

// Text parts (input_text, output_text; chat's text) joined as chat joins its parts.
std::string join_parts(const json::array& parts, const std::string& where) {
  std::string text;
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!parts[j].is_object()) fail("'" + at + "' must be an object", at);
    const json::object& part = parts[j].as_object();
    const std::string type(*string_field(part, "type", at, true));
    if (media_part(type))
      fail("content parts of type '" + type + "' are not supported by this text-only model", at + ".type");
    if (type == "refusal") {
      text.append(*string_field(part, "refusal", at, true));
      continue;
    }
    if (type != "input_text" && type != "output_text" && type != "text")
      fail("unknown content part type '" + type + "'", at + ".type");
    text.append(*string_field(part, "text", at, true));
  }
  return text;
}

std::string content_text(const json::object& item, const std::string& at) {
  const json::value* c = item.if_contains("content");
  if (!c || c->is_null()) fail("'" + at + ".content' is required", at + ".content");
  if (c->is_string()) return std::string(c->as_string());
  if (c->is_array()) return join_parts(c->as_array(), at + ".content");
  fail("'" + at + ".content' must be a string or a list of content parts", at + ".content");
}

// The last message when it is an assistant turn that so far holds only reasoning (a reasoning item's):
// the assistant message or function call that follows belongs to it.
json::object* reasoning_turn(json::array& messages) {
  if (messages.empty()) return nullptr;
  json::object& last = messages.back().as_object();
  const json::value* content = last.if_contains("content");
  const bool only_reasoning = last.at("role").as_string() == "assistant" && last.contains("reasoning_content") &&
                              !last.contains("tool_calls") && content && content->is_string() &&
                              content->as_string().empty();
  return only_reasoning ? &last : nullptr;
}

void append_message(const json::object& item, const std::string& at, json::array& messages) {
  const std::string role(*string_field(item, "role", at, true));
  if (role != "user" && role != "system" && role != "developer" && role != "assistant")
    fail("unknown role '" + role + "' (user, system, developer or assistant)", at + ".role");
  if (json::object* turn = role == "assistant" ? reasoning_turn(messages) : nullptr) {
    (*turn)["content"] = content_text(item, at);
    return;
  }
  // Chat templates know system, not developer: the Responses API's developer message is its system message.
  json::object msg{{"role", role == "developer" ? "system" : role}, {"content", content_text(item, at)}};
  messages.push_back(std::move(msg));
}

void append_function_call(const json::object& item, const std::string& at, json::array& messages) {
  const json::string& call_id = *string_field(item, "call_id", at, true);
  const json::string& name = *string_field(item, "name", at, true);
  const json::string& arguments = *string_field(item, "arguments", at, true);
  json::object call{{"id", call_id}, {"type", "function"},
                    {"function", json::object{{"name", name}, {"arguments", arguments}}}};
  // A call right after an assistant turn belongs to it (text then calls, or parallel calls).
  if (!messages.empty()) {
    json::object& last = messages.back().as_object();
    if (last.at("role").as_string() == "assistant") {
      json::value& calls = last["tool_calls"];
      if (!calls.is_array()) calls = json::array{};
      calls.as_array().push_back(std::move(call));
      return;
    }
  }
  messages.push_back(json::object{{"role", "assistant"}, {"tool_calls", json::array{std::move(call)}}});
}

// Text parts of one type ("reasoning_text" in content, "summary_text" in summary), joined by blank lines.
std::string reasoning_parts(const json::value* v, const std::string& where, const char* part_type) {
  if (!v || v->is_null()) return {};
  if (!v->is_array()) fail("'" + where + "' must be a list of " + part_type + " parts", where);
  std::string text;
  const json::array& parts = v->as_array();
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!parts[j].is_object()) fail("'" + at + "' must be an object", at);
    const json::string& type = *string_field(parts[j].as_object(), "type", at, true);
    if (type != part_type) fail("'" + at + ".type' must be '" + part_type + "'", at + ".type");
    if (j > 0) text += "\n\n";
    text.append(*string_field(parts[j].as_object(), "text", at, true));
  }
  return text;
}

// A reasoning item (an earlier answer's reasoning) as the reasoning_content of the assistant turn it opens,
// as the chat path takes an assistant message's reasoning_content: its content's reasoning_text, else its
// summary's summary_text. The chat template decides whether earlier turns' reasoning reaches the prompt.
void append_reasoning(const json::object& item, const std::string& at, json::array& messages) {
  if (const json::value* e = item.if_contains("encrypted_content"); e && !e->is_null())
    fail("encrypted reasoning is not supported: send the reasoning's text as 'content' or 'summary'",
         at + ".encrypted_content");
  const json::value* summary = item.if_contains("summary");
  if (!summary) fail("'" + at + ".summary' is required", at + ".summary");
  std::string text = reasoning_parts(item.if_contains("content"), at + ".content", "reasoning_text");
  const std::string summarized = reasoning_parts(summary, at + ".summary", "summary_text");
  if (text.empty()) text = summarized;
  if (json::object* turn = reasoning_turn(messages)) {
    json::string& earlier = (*turn)["reasoning_content"].as_string();
    if (!earlier.empty() && !text.empty()) earlier.append("\n\n");
    earlier.append(text);
    return;
  }
  messages.push_back(json::object{{"role", "assistant"}, {"content", ""}, {"reasoning_content", std::move(text)}});
}

void append_function_output(const json::object& item, const std::string& at, json::array& messages) {
  const json::string& call_id = *string_field(item, "call_id", at, true);
  const json::value* out = item.if_contains("output");
  std::string text;
  if (out && out->is_string()) text = out->as_string();
  else if (out && out->is_array()) text = join_parts(out->as_array(), at + ".output");
  else fail("'" + at + ".output' must be a string or a list of text parts", at + ".output");
  messages.push_back(json::object{{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(text)}});
}

void append_item(const json::value& v, const std::string& at, const ResponsesItemResolver& resolve, int depth,
                 json::array& messages) {
  if (!v.is_object()) fail("'" + at + "' must be an object", at);
  const json::object& item = v.as_object();
  const json::string* type = string_field(item, "type", at, false);
  if (!type || *type == "message") return append_message(item, at, messages);
  if (*type == "function_call") return append_function_call(item, at, messages);
  if (*type == "function_call_output") return append_function_output(item, at, messages);
  if (*type == "reasoning") return append_reasoning(item, at, messages);
  if (*type == "item_reference") {
    const std::string id(*string_field(item, "id", at, true));
    const json::object* target = resolve && depth == 0 ? resolve(id) : nullptr;
    if (!target) fail("no stored item with id '" + id + "' (item_reference)", at + ".id");
    return append_item(*target, at, resolve, depth + 1, messages);
  }
  fail("input items of type '" + std::string(*type) +
           "' are not supported (message, reasoning, function_call, function_call_output, item_reference)",
       at + ".type");
}

}  // namespace

json::object responses_chat_tool(const json::object& tool, std::string_view where) {
  const std::string at(where);
  const json::string* type = string_field(tool, "type", at, true);
  if (*type != "function")
    fail("tools of type '" + std::string(*type) + "' are not supported: this server runs no built-in tools (only 'function')",
         at + ".type");
  const json::string* name = string_field(tool, "name", at, true);
  if (name->empty()) fail("'" + at + ".name' is required", at + ".name");
  json::object fn{{"name", *name}};
  if (const json::string* d = string_field(tool, "description", at, false)) fn["description"] = *d;
  if (const json::value* p = tool.if_contains("parameters"); p && !p->is_null()) {
    if (!p->is_object()) fail("'" + at + ".parameters' must be an object", at + ".parameters");
    fn["parameters"] = *p;
  }
  if (const json::value* s = tool.if_contains("strict"); s && !s->is_null()) {
    if (!s->is_bool()) fail("'" + at + ".strict' must be true or false", at + ".strict");
    fn["strict"] = *s;
  }
  return {{"type", "function"}, {"function", std::move(fn)}};
}

json::array responses_input_items(const json::value& input) {
  if (input.is_string())
    return json::array{json::object{{"type", "message"}, {"role", "user"}, {"content", input.as_string()}}};
  if (input.is_array()) {
    if (input.as_array().empty()) fail("'input' must not be empty", "input");
    return input.as_array();
  }
  fail("'input' must be a string or a list of input items", "input");
}

void append_responses_messages(const json::array& items, std::string_view where, const ResponsesItemResolver& resolve,
                               json::array& messages) {
  for (std::size_t i = 0; i < items.size(); ++i)
    append_item(items[i], std::string(where) + "[" + std::to_string(i) + "]", resolve, 0, messages);
}

}  // namespace kvfleet
