// The output of a forced tool_choice, which the grammar engine constrains to JSON (vLLM's shapes):
//   a named function: the output is that function's arguments, {"city": "Paris"};
//   "required":        a list of calls, [{"name": "get_weather", "parameters": {"city": "Paris"}}, ...].
// Nothing in such an output is content. The scans follow the JSON as far as it goes, so a stream sends the
// name first and the arguments as they grow.
#include <boost/json.hpp>

#include "engine/core/tools/formats.h"
#include "engine/core/tools/scan_util.h"

namespace kvfleet::tools {
namespace {

class NamedCallParser final : public ToolParser {
 public:
  explicit NamedCallParser(std::string function) : function_(std::move(function)) {}
  std::string_view name() const override { return "named function"; }

  ToolScan scan(std::string_view text, bool final) const override {
    ToolScan s;
    s.started = true;
    const ValueSpan v = scan_json_value(text, 0, final);
    if (v.state == Span::invalid && !(final && v.begin >= text.size())) {
      s.valid = false;
      return s;
    }
    CallScan c;
    c.name = function_;
    if (v.begin < text.size()) c.arguments = std::string(text.substr(v.begin, v.end - v.begin));
    c.complete = v.state == Span::complete;
    s.calls.push_back(std::move(c));
    return s;
  }

  std::string tools_prompt(const boost::json::array& tools) const override { return forced_tools_prompt(tools); }

 private:
  std::string function_;
};

class CallListParser final : public ToolParser {
 public:
  std::string_view name() const override { return "required"; }

  ToolScan scan(std::string_view text, bool final) const override {
    ToolScan s;
    s.started = true;
    std::size_t p = skip_ws(text, 0);
    if (p >= text.size()) {
      s.valid = !final;
      return s;
    }
    if (text[p] != '[') {
      s.valid = false;
      return s;
    }
    p = skip_ws(text, p + 1);
    while (p < text.size()) {
      CallObject c = scan_call_object(text, p, final);
      if (c.state == Span::invalid) {
        s.valid = false;
        return s;
      }
      s.calls.push_back(std::move(c.call));
      if (c.state == Span::incomplete) return s;
      p = skip_ws(text, c.end);
      if (p >= text.size() || text[p] == ']') return s;
      if (text[p] != ',') {
        s.valid = false;
        return s;
      }
      p = skip_ws(text, p + 1);
    }
    return s;
  }

  std::string tools_prompt(const boost::json::array& tools) const override { return forced_tools_prompt(tools); }
};

}  // namespace

std::string forced_tools_prompt(const boost::json::array& tools) {
  return "You can call these functions; answer with a call in JSON:\n" + tools_lines(tools);
}

std::unique_ptr<ToolParser> make_named_call_parser(std::string function) {
  return std::make_unique<NamedCallParser>(std::move(function));
}

std::unique_ptr<ToolParser> make_call_list_parser() { return std::make_unique<CallListParser>(); }

}  // namespace kvfleet::tools
