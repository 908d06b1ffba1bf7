// Pieces the tool-call formats share: markers that may still be arriving, JSON values that may still be
// arriving, and the {"name": ..., "arguments": {...}} object most formats use. Internal to engine/core/tools.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "kvfleet/tool_parser.h"

namespace kvfleet::tools {

// The length of the longest end of `text` that is the beginning of `marker` (what a stream holds back).
std::size_t held_prefix(std::string_view text, std::string_view marker);
std::size_t skip_ws(std::string_view text, std::size_t pos);
bool starts_at(std::string_view text, std::size_t pos, std::string_view s);

enum class Span { complete, incomplete, invalid };
struct ValueSpan {
  Span state = Span::incomplete;
  std::size_t begin = 0, end = 0;  // [begin, end): the value (end: where the text stops when incomplete)
};
// One JSON value from `pos` (after whitespace). A complete value is checked to be valid JSON. A number or
// literal that reaches the end of the text is incomplete unless `final`.
ValueSpan scan_json_value(std::string_view text, std::size_t pos, bool final);

struct CallObject {
  Span state = Span::incomplete;
  std::size_t end = 0;  // after the closing brace when complete
  CallScan call;
};
// {"name": "f", "arguments": {...}} from `pos` (after whitespace); the arguments key may be "arguments"
// or "parameters", and arguments given as a JSON string holding JSON count as that JSON.
CallObject scan_call_object(std::string_view text, std::size_t pos, bool final);

// A fresh id: prefix + `n` random letters and digits.
std::string random_call_id(const char* prefix, int n);

// A tool object's function ({"type": "function", "function": {...}} -> the inner object; else itself).
const boost::json::value& function_of(const boost::json::value& tool);

}  // namespace kvfleet::tools
