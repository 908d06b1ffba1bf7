// What a chat request's tool_choice asks of this replica, decided as vLLM decides it:
//   none     - tools reach the prompt, the answer is not parsed for calls;
//   auto     - (the default when tools are given) served with --enable-auto-tool-choice and a
//              --tool-call-parser, whose format the answer is parsed in; else a 400 that says so;
//   required - and a named function: a 400 until the grammar engine constrains the output. What remains
//              is that constraint: a JSON schema for the call(s) (an array of {name: const, arguments: the
//              tool's parameters}, or the named tool's parameters alone) handed to the grammar engine, and
//              the constrained JSON read back as tool_calls; the prompt side and the answer's shape are
//              the ones auto uses.
#include <boost/json.hpp>

#include "engine/server/api/request.h"
#include "engine/server/replica.h"

namespace kvfleet::server {

bool Replica::parses_tool_calls(const ChatRequest& r) const {
  const bool tools = r.tools.is_array() && !r.tools.as_array().empty();
  if (!tools) {
    if (r.tool_choice && r.tool_choice->mode != "none")
      throw bad_request("'tool_choice' needs 'tools'", "tool_choice");
    return false;
  }
  const std::string mode = r.tool_choice ? r.tool_choice->mode : "auto";
  if (mode == "none") return false;
  if (mode == "function") {
    bool known = false;
    for (const auto& t : r.tools.as_array())
      if (const auto* n = t.as_object().at("function").as_object().if_contains("name"); n && n->is_string() && n->as_string() == r.tool_choice->function)
        known = true;
    if (!known)
      throw bad_request("'tool_choice' names the function '" + r.tool_choice->function + "', which is not in 'tools'",
                        "tool_choice");
  }
  if (mode == "required" || mode == "function")
    throw bad_request(std::string("'tool_choice' ") + (mode == "required" ? "\"required\"" : "naming a function") +
                          " needs constrained decoding, which this replica does not serve yet; use \"auto\" or \"none\"",
                      "tool_choice");
  if (!config_.enable_auto_tool_choice || !tool_parser_)
    throw bad_request("\"auto\" tool choice requires the replica to run with --enable-auto-tool-choice and "
                      "--tool-call-parser",
                      "tool_choice");
  return true;
}

}  // namespace kvfleet::server
