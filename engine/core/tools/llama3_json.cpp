// llama3_json: Llama 3.1/3.2 answer a call with a JSON object as the whole output, optionally after
// <|python_tag|>, several separated by ';':
//   {"name": "get_weather", "parameters": {"city": "Paris"}}
// Output that does not open that way is content.
#include <boost/json.hpp>

#include "engine/core/tools/formats.h"
#include "engine/core/tools/scan_util.h"

namespace kvfleet::tools {
namespace {

constexpr std::string_view python_tag = "<|python_tag|>";

class Llama3JsonParser final : public ToolParser {
 public:
  std::string_view name() const override { return "llama3_json"; }

  ToolScan scan(std::string_view text, bool final) const override {
    ToolScan s;
    std::size_t p = skip_ws(text, 0);
    const std::string_view rest = text.substr(p);
    if (starts_at(text, p, python_tag)) {
      p = skip_ws(text, p + python_tag.size());
    } else if (rest.empty() || (python_tag.substr(0, rest.size()) == rest)) {
      s.content_end = final ? text.size() : 0;  // undecided until more comes
      return s;
    } else if (text[p] != '{') {
      s.content_end = text.size();
      return s;
    }
    s.started = true;
    while (true) {
      CallObject c = scan_call_object(text, p, final);
      if (c.state == Span::invalid) {
        s.valid = false;
        return s;
      }
      s.calls.push_back(std::move(c.call));
      if (c.state == Span::incomplete) return s;
      p = skip_ws(text, c.end);
      if (p >= text.size()) return s;
      if (text[p] != ';') {
        s.valid = false;
        return s;
      }
      p = skip_ws(text, p + 1);
      if (p >= text.size()) return s;
    }
  }

  // Llama 3.1's JSON tool-calling instructions (its chat template's words).
  std::string tools_prompt(const boost::json::array& tools) const override {
    return "Given the following functions, please respond with a JSON for a function call with its proper "
           "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
           "\"parameters\": dictionary of argument name and its value}. Do not use variables.\n\n" +
           tools_lines(tools);
  }
};

}  // namespace

std::unique_ptr<ToolParser> make_llama3_json_parser() { return std::make_unique<Llama3JsonParser>(); }

}  // namespace kvfleet::tools
