// Tool calls in a model's output text, in the formats vLLM's --tool-call-parser names: hermes
// (Qwen2.5/Qwen3 `<tool_call>{json}</tool_call>`), llama3_json, mistral ([TOOL_CALLS]), deepseek_v3 and
// pythonic. Pure text in, calls out: no I/O, no engine; the chat and responses handlers share it.
//
// Each format is one `scan` of the text so far: the content before the calls, and each call's name and
// the arguments' JSON text as far as it goes. A scan of a longer text only ever extends the previous one
// (names appear once complete, arguments grow), so a stream sends the difference between two scans and
// a whole answer is the scan of the whole text: streamed and non-streamed answers agree by construction.
//
// Thread-safety: a ToolParser is immutable; scan() may run on any thread. A ToolCallStream is one
// choice's state and belongs to the thread that streams it.
#pragma once

#include <boost/json/array.hpp>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvfleet::tools {

struct ToolCall {
  std::string id;         // "call_..." (mistral: 9 letters and digits, which its chat templates check)
  std::string name;
  std::string arguments;  // JSON text, as the model wrote it
};

// One call as far as a scan reached.
struct CallScan {
  std::string name;        // empty until the name is complete
  std::string arguments;   // the arguments' JSON text so far: a prefix of the final text
  bool complete = false;   // the call ended and its arguments are valid JSON
};

struct ToolScan {
  // Text [0, content_end) is content. Before any call starts it stops short of what could still become
  // a call's opening marker, so that markup never leaks into a stream.
  std::size_t content_end = 0;
  bool started = false;  // a call's opening was seen
  // false when the text that opened a call cannot be one (bad JSON, text that is not a call list):
  // then the whole output is content, as vLLM answers.
  bool valid = true;
  std::vector<CallScan> calls;
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  virtual std::string_view name() const = 0;
  // `final`: the text is the whole output (nothing held back for a marker that may still come).
  virtual ToolScan scan(std::string_view text, bool final) const = 0;
  // Instructions describing `tools` (OpenAI tool objects) and this format, for a chat template that has
  // no tools section of its own. Deterministic: the router renders the same prompt.
  virtual std::string tools_prompt(const boost::json::array& tools) const = 0;
  // The format's markers are special tokens (mistral's [TOOL_CALLS]): the output must be decoded with
  // special tokens kept.
  virtual bool needs_special_tokens() const { return false; }
  virtual std::string make_call_id() const;
};

// The parser called `name`, or nullptr for an unknown name.
std::unique_ptr<ToolParser> make_tool_parser(std::string_view name);
// "deepseek_v3, hermes, llama3_json, mistral, pythonic".
std::string tool_parser_names();

// The parsers of an output that a forced tool_choice constrains to JSON (the server's grammar does that):
// named, the output is `function`'s arguments object; required, a JSON list of
// {"name": ..., "parameters": {...}} calls. Their tools_prompt lists the tools as JSON.
std::unique_ptr<ToolParser> make_named_call_parser(std::string function);
std::unique_ptr<ToolParser> make_call_list_parser();

struct ParsedTools {
  std::optional<std::string> content;  // null when the output was calls and nothing else but whitespace
  std::vector<ToolCall> calls;
};
// The whole output: its calls (at most one unless `parallel`) and the text outside them. Output that
// opens a call but is not one comes back whole as content.
ParsedTools parse_tool_calls(const ToolParser& parser, std::string_view text, bool parallel = true);

// One tool-call delta of a stream, as the OpenAI API streams them: the first for a call has the id, the
// name and empty arguments; the next ones only argument fragments.
struct ToolCallDelta {
  std::size_t index = 0;
  std::optional<std::string> id, name;
  std::string arguments;
};

struct StreamDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

class ToolCallStream {
 public:
  ToolCallStream(const ToolParser& parser, bool parallel) : parser_(parser), parallel_(parallel) {}
  // The next piece of output text; returns what may be sent now.
  StreamDelta push(std::string_view piece);
  // The output ended: everything still held.
  StreamDelta finish();
  bool called() const { return !sent_.empty(); }

 private:
  StreamDelta step(bool final);
  const ToolParser& parser_;
  bool parallel_;
  std::string text_;
  std::size_t content_sent_ = 0;
  bool content_only_ = false;  // the opening turned out not to be a call
  struct Sent {
    std::string id;
    std::size_t arguments = 0;
  };
  std::vector<Sent> sent_;
};

}  // namespace kvfleet::tools
