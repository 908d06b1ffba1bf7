// deepseek_v3: DeepSeek-V3 and R1 write their calls between tokens of their own:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//   ```json
//   {"city": "Paris"}
//   ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
// Text before the calls is content.
#include <boost/json.hpp>

#include "engine/core/tools/formats.h"
#include "engine/core/tools/scan_util.h"

namespace kvfleet::tools {
namespace {

constexpr std::string_view calls_begin = "<｜tool▁calls▁begin｜>", calls_end = "<｜tool▁calls▁end｜>",
                           call_begin = "<｜tool▁call▁begin｜>", call_end = "<｜tool▁call▁end｜>",
                           sep = "<｜tool▁sep｜>", fence = "\n```json\n";

class DeepSeekV3Parser final : public ToolParser {
 public:
  std::string_view name() const override { return "deepseek_v3"; }

  ToolScan scan(std::string_view text, bool final) const override {
    ToolScan s;
    const std::size_t at = text.find(calls_begin);
    if (at == std::string_view::npos) {
      s.content_end = text.size() - (final ? 0 : held_prefix(text, calls_begin));
      return s;
    }
    s.started = true;
    s.content_end = at;
    std::size_t p = at + calls_begin.size();
    // Where the text stops short of another call: at the end of a final text, only complete calls count.
    auto stop = [&] {
      if (final && (s.calls.empty() || !s.calls.back().complete)) s.valid = false;
      return s;
    };
    auto bad = [&] {
      s.valid = false;
      return s;
    };
    while (true) {
      p = skip_ws(text, p);
      const std::string_view rest = text.substr(p);
      if (rest.empty() || starts_at(text, p, calls_end)) return stop();
      if (!starts_at(text, p, call_begin)) return call_begin.substr(0, rest.size()) == rest ? stop() : bad();
      const std::size_t sep_at = text.find(sep, p + call_begin.size());
      if (sep_at == std::string_view::npos) return stop();
      const std::size_t name_at = sep_at + sep.size();
      const std::size_t fence_at = text.find(fence, name_at);
      if (fence_at == std::string_view::npos) return stop();
      CallScan call;
      call.name = text.substr(name_at, fence_at - name_at);
      const ValueSpan v = scan_json_value(text, fence_at + fence.size(), final);
      if (v.state == Span::invalid || call.name.empty()) return bad();
      call.arguments = text.substr(v.begin, v.end - v.begin);
      call.complete = v.state == Span::complete;
      s.calls.push_back(std::move(call));
      if (v.state == Span::incomplete) return s;
      p = skip_ws(text, v.end);
      if (starts_at(text, p, "```")) p += 3;
      p = skip_ws(text, p);
      if (starts_at(text, p, call_end)) p += call_end.size();
    }
  }

  std::string tools_prompt(const boost::json::array& tools) const override {
    return "## Tools\n\n### Function\n\nYou have the following functions available:\n\n" + tools_lines(tools) +
           "\nTo call a function, answer with <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
           "FUNCTION_NAME\n```json\nARGUMENTS_JSON\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  }
};

}  // namespace

std::unique_ptr<ToolParser> make_deepseek_v3_parser() { return std::make_unique<DeepSeekV3Parser>(); }

}  // namespace kvfleet::tools
