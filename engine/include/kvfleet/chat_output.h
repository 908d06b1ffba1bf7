// A chat answer's text taken apart: reasoning (kvfleet/reasoning_parser.h) first, then tool calls
// (kvfleet/tool_parser.h) in what follows the reasoning, the rest content. Whole (non-streamed answers)
// or piece by piece (streams); both give the same parts.
//
// Thread-safety: a ChatOutputStream is one choice's state, used by one thread at a time; the parsers it
// points to must outlive it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvfleet/reasoning_parser.h"
#include "kvfleet/tool_parser.h"

namespace kvfleet::tools {

struct ChatOutputOptions {
  const ReasoningParser* reasoning = nullptr;  // null: no reasoning split
  const ToolParser* tools = nullptr;           // null: no tool calls (no tools, or tool_choice none)
  bool parallel_tool_calls = true;             // false: at most one call
};

struct ChatOutputParts {
  std::optional<std::string> reasoning;  // set when the output has a reasoning part
  std::optional<std::string> content;    // null for calls alone, or reasoning without an answer
  std::vector<ToolCall> calls;
};
ChatOutputParts parse_chat_output(std::string_view text, const ChatOutputOptions& options);

struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class ChatOutputStream {
 public:
  explicit ChatOutputStream(const ChatOutputOptions& options);
  ChatDelta push(std::string_view piece);
  ChatDelta finish();
  bool called() const { return tools_ && tools_->called(); }

 private:
  ChatDelta step(std::string_view piece, bool final);
  ChatOutputOptions options_;
  std::string text_;
  std::size_t reasoning_sent_ = 0, content_fed_ = 0;
  std::optional<ToolCallStream> tools_;
};

}  // namespace kvfleet::tools
