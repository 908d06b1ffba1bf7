// How a chat request's tools reach the prompt, the same in the replica and in the router (whose prefix
// routing must see the replica's tokens):
// - the request's `tools`, or its legacy `functions` as tools;
// - the chat template's own tools section when it has one (template_renders_tools), else the tool
//   parser's instructions (ToolParser::tools_prompt) added to the system message, else refused;
// - assistant messages' tool_calls with arguments given as a JSON string get them as an object, as
//   Hugging Face templates expect (`arguments | tojson` in Qwen's and Llama's).
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <stdexcept>

#include "kvfleet/chat_template.h"
#include "kvfleet/tool_parser.h"

namespace kvfleet::tools {

// The template has no tools section and no parser supplies a format.
struct ToolsNotRenderable : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// `tools`, else `functions` as [{"type": "function", "function": f}], else null. Shapes are the request
// parser's business: whatever is not a list passes through unchanged.
boost::json::value request_tools(const boost::json::object& body);

// Renders a one-message chat with a probe tool: true when the tool's name reaches the prompt.
bool template_renders_tools(const ChatTemplate& chat_template);

// Puts `tools` (a non-empty list, or null/empty for none) where the template reads them: opts.tools, or
// the parser's instructions in `messages`' system message. Converts tool_calls arguments. Throws
// ToolsNotRenderable when tools are given and neither way exists.
void prepare_chat_tools(boost::json::array& messages, ChatTemplateOptions& opts, const boost::json::value& tools,
                        bool template_renders, const ToolParser* parser);

}  // namespace kvfleet::tools
