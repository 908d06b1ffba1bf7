// The Responses API's input items as chat messages for the chat template. Shared by the replica and the
// router: both must render the same template text (the router hashes it for routing, Contract 1) and
// agree on what is refused.
//
//   message item {role, content}            -> {role, content} (developer becomes system; content
//                                              parts input_text/output_text joined, like chat's text parts)
//   function_call {call_id, name, arguments} -> an assistant message's tool_calls entry (joined to the
//                                              assistant message right before it, so parallel calls and a
//                                              text + calls turn stay one message)
//   function_call_output {call_id, output}   -> {role: tool, tool_call_id, content}
//   reasoning {summary, content}             -> the reasoning_content of the assistant turn it opens (the
//                                              assistant message and function calls after it join that
//                                              turn): content's reasoning_text parts, else summary's
//                                              summary_text parts; encrypted_content is refused
//   item_reference {id}                      -> the referenced item, through `resolve`
// Anything else (images, files, audio and built-in tool items) throws ContentPartError naming the
// field: this is a text-only server without built-in tools.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <functional>
#include <string_view>

#include "kvfleet/chat_content.h"

namespace kvfleet {

// Finds the item an item_reference names (a stored response's output or input item); nullptr: unknown.
using ResponsesItemResolver = std::function<const boost::json::object*(std::string_view id)>;

// The input given as a string becomes one user message item; a list is taken as it is. Throws
// ContentPartError ("input" / "input[2].content[0].type") for anything else.
boost::json::array responses_input_items(const boost::json::value& input);

// Appends the chat messages for `items` to `messages`. `where` names the list in errors ("input").
// Without a resolver an item_reference throws (the router, which holds no responses, routes such a
// request without a prefix match; the replica answers).
void append_responses_messages(const boost::json::array& items, std::string_view where,
                               const ResponsesItemResolver& resolve, boost::json::array& messages);

// A Responses function tool ({type: function, name, description, parameters, strict}, flat) as chat
// completions nests it ({type: function, function: {...}}), the shape chat templates render. Throws
// ContentPartError for a tool that is not a named function.
boost::json::object responses_chat_tool(const boost::json::object& tool, std::string_view where);

}  // namespace kvfleet
