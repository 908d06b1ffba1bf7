// mistral: Mistral models open their calls with the special token [TOOL_CALLS], then either a JSON list
// (tokenizer versions before v11)
//   [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
// or, from v11, each call as a name and its arguments:
//   [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]...
// Text before the first [TOOL_CALLS] is content. Call ids are 9 letters and digits, which Mistral's chat
// templates require of the tool_call_id they are given back.
#include <boost/json.hpp>

#include "engine/core/tools/formats.h"
#include "engine/core/tools/scan_util.h"

namespace kvfleet::tools {
namespace {

constexpr std::string_view open_tag = "[TOOL_CALLS]", args_tag = "[ARGS]";

// [{...}, {...}] from `p` (just after the '[').
void scan_list(std::string_view text, std::size_t p, bool final, ToolScan& s) {
  while (true) {
    CallObject c = scan_call_object(text, p, final);
    if (c.state == Span::invalid) {
      s.valid = false;
      return;
    }
    s.calls.push_back(std::move(c.call));
    if (c.state == Span::incomplete) return;
    p = skip_ws(text, c.end);
    if (p >= text.size()) {
      s.valid = !final;
      return;
    }
    if (text[p] == ']') return;
    if (text[p] != ',') {
      s.valid = false;
      return;
    }
    ++p;
  }
}

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }

// name[ARGS]{...}, repeated after further [TOOL_CALLS], from `p`.
void scan_named(std::string_view text, std::size_t p, bool final, ToolScan& s) {
  while (true) {
    const std::size_t args = text.find(args_tag, p);
    if (args == std::string_view::npos) {
      for (std::size_t i = p; i < text.size(); ++i)
        if (!name_char(text[i]) && text[i] != '[') s.valid = false;
      if (final) s.valid = false;
      return;
    }
    CallScan call;
    call.name = text.substr(p, args - p);
    for (char c : call.name)
      if (!name_char(c)) s.valid = false;
    if (call.name.empty() || !s.valid) {
      s.valid = false;
      return;
    }
    const ValueSpan v = scan_json_value(text, args + args_tag.size(), final);
    if (v.state == Span::invalid) {
      s.valid = false;
      return;
    }
    call.arguments = text.substr(v.begin, v.end - v.begin);
    call.complete = v.state == Span::complete;
    s.calls.push_back(std::move(call));
    if (v.state == Span::incomplete) return;
    p = skip_ws(text, v.end);
    if (!starts_at(text, p, open_tag)) return;
    p += open_tag.size();
  }
}

class MistralParser final : public ToolParser {
 public:
  std::string_view name() const override { return "mistral"; }

  ToolScan scan(std::string_view text, bool final) const override {
    ToolScan s;
    const std::size_t at = text.find(open_tag);
    if (at == std::string_view::npos) {
      s.content_end = text.size() - (final ? 0 : held_prefix(text, open_tag));
      return s;
    }
    s.started = true;
    s.content_end = at;
    const std::size_t p = skip_ws(text, at + open_tag.size());
    if (p >= text.size()) {
      s.valid = !final;
      return s;
    }
    if (text[p] == '[') scan_list(text, p + 1, final, s);
    else scan_named(text, p, final, s);
    return s;
  }

  std::string tools_prompt(const boost::json::array& tools) const override {
    return "You can call these functions:\n" + tools_lines(tools) +
           "\nTo call functions, answer with [TOOL_CALLS] followed by a JSON list of calls: "
           "[TOOL_CALLS][{\"name\": <function-name>, \"arguments\": <args-json-object>}]";
  }

  bool needs_special_tokens() const override { return true; }
  std::string make_call_id() const override { return random_call_id("", 9); }
};

}  // namespace

std::unique_ptr<ToolParser> make_mistral_parser() { return std::make_unique<MistralParser>(); }

}  // namespace kvfleet::tools
