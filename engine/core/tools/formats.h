// The tool-call formats (one file each); make_tool_parser picks one by name.
#pragma once

#include <memory>

#include "kvfleet/tool_parser.h"

namespace kvfleet::tools {

std::unique_ptr<ToolParser> make_hermes_parser();
std::unique_ptr<ToolParser> make_llama3_json_parser();
std::unique_ptr<ToolParser> make_mistral_parser();
std::unique_ptr<ToolParser> make_deepseek_v3_parser();
std::unique_ptr<ToolParser> make_pythonic_parser();

// The tools as JSON, one per line (the prompts of the formats without a house style).
std::string tools_lines(const boost::json::array& tools);
// The tools described for a forced tool_choice on a template without a tools section.
std::string forced_tools_prompt(const boost::json::array& tools);

}  // namespace kvfleet::tools
