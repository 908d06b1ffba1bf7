// hermes: Hermes-2-Pro, Qwen2.5 and Qwen3 write each call as
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
// after optional text (the content). Text after the first call is not content (as vLLM's hermes parser).
#include "engine/core/tools/formats.h"

#include <boost/json.hpp>

#include "engine/core/tools/scan_util.h"

namespace kvfleet::tools {
namespace {

constexpr std::string_view open_tag = "<tool_call>", close_tag = "</tool_call>";

class HermesParser final : public ToolParser {
 public:
  std::string_view name() const override { return "hermes"; }

  ToolScan scan(std::string_view text, bool final) const override {
    ToolScan s;
    std::size_t at = text.find(open_tag);
    if (at == std::string_view::npos) {
      s.content_end = text.size() - (final ? 0 : held_prefix(text, open_tag));
      return s;
    }
    s.started = true;
    s.content_end = at;
    while (at != std::string_view::npos) {
      CallObject c = scan_call_object(text, at + open_tag.size(), final);
      if (c.state == Span::invalid) {
        s.valid = false;
        return s;
      }
      s.calls.push_back(std::move(c.call));
      if (c.state == Span::incomplete) return s;
      std::size_t p = skip_ws(text, c.end);
      if (starts_at(text, p, close_tag)) p += close_tag.size();
      at = text.find(open_tag, p);
    }
    return s;
  }

  // Qwen2.5's own words for its tools section.
  std::string tools_prompt(const boost::json::array& tools) const override {
    std::string out =
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
        "function signatures within <tools></tools> XML tags:\n<tools>";
    for (const auto& t : tools) {
      out += '\n';
      out += boost::json::serialize(t);
    }
    out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call>";
    return out;
  }
};

}  // namespace

std::unique_ptr<ToolParser> make_hermes_parser() { return std::make_unique<HermesParser>(); }

}  // namespace kvfleet::tools
