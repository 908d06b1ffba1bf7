// The parsers by name, a whole output's calls, and a stream's deltas (the difference between scans).
#include "kvfleet/tool_parser.h"

#include <boost/json.hpp>

#include "engine/core/tools/formats.h"
#include "engine/core/tools/scan_util.h"

namespace kvfleet::tools {

std::string ToolParser::make_call_id() const { return random_call_id("call_", 24); }

std::unique_ptr<ToolParser> make_tool_parser(std::string_view name) {
  if (name == "hermes") return make_hermes_parser();
  if (name == "llama3_json") return make_llama3_json_parser();
  if (name == "mistral") return make_mistral_parser();
  if (name == "deepseek_v3") return make_deepseek_v3_parser();
  if (name == "pythonic") return make_pythonic_parser();
  return nullptr;
}

std::string tool_parser_names() { return "deepseek_v3, hermes, llama3_json, mistral, pythonic"; }

std::string tools_lines(const boost::json::array& tools) {
  std::string out;
  for (const auto& t : tools) out += boost::json::serialize(t) + "\n";
  return out;
}

namespace {

bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

// A final scan that found calls to answer with.
bool answers_with_calls(const ToolScan& s) {
  return s.started && s.valid && !s.calls.empty() && s.calls.front().complete;
}

}  // namespace

ParsedTools parse_tool_calls(const ToolParser& parser, std::string_view text, bool parallel) {
  ParsedTools out;
  const ToolScan s = parser.scan(text, true);
  if (!answers_with_calls(s)) {
    out.content = std::string(text);
    return out;
  }
  for (const CallScan& c : s.calls) {
    if (!c.complete || (!parallel && !out.calls.empty())) break;
    out.calls.push_back({parser.make_call_id(), c.name, c.arguments});
  }
  const std::string_view content = text.substr(0, s.content_end);
  if (!blank(content)) out.content = std::string(content);
  return out;
}

StreamDelta ToolCallStream::push(std::string_view piece) {
  text_ += piece;
  return step(false);
}

StreamDelta ToolCallStream::finish() { return step(true); }

StreamDelta ToolCallStream::step(bool final) {
  StreamDelta d;
  if (!content_only_) {
    const ToolScan s = parser_.scan(text_, final);
    // Not a call after all (before any call went out): everything is content.
    content_only_ = sent_.empty() && (!s.valid || (final && s.started && !answers_with_calls(s)));
    if (!content_only_) {
      // Content that is only whitespace before calls is no content (as a whole answer says), so
      // trailing whitespace waits until text or the end follows it.
      std::size_t end = s.content_end;
      if (s.started && blank(std::string_view(text_).substr(0, end))) end = content_sent_;
      if (!s.started && !final)
        while (end > content_sent_ && std::string_view(" \t\r\n").find(text_[end - 1]) != std::string_view::npos) --end;
      if (end > content_sent_) {
        d.content = text_.substr(content_sent_, end - content_sent_);
        content_sent_ = end;
      }
      const std::size_t limit = parallel_ ? s.calls.size() : std::min<std::size_t>(1, s.calls.size());
      for (std::size_t i = 0; i < limit && !s.calls[i].name.empty(); ++i) {
        const CallScan& c = s.calls[i];
        if (i >= sent_.size()) {
          sent_.push_back({parser_.make_call_id(), 0});
          d.calls.push_back({i, sent_[i].id, c.name, ""});
        }
        if (c.arguments.size() > sent_[i].arguments) {
          d.calls.push_back({i, std::nullopt, std::nullopt, c.arguments.substr(sent_[i].arguments)});
          sent_[i].arguments = c.arguments.size();
        }
      }
      return d;
    }
  }
  d.content = text_.substr(content_sent_);
  content_sent_ = text_.size();
  return d;
}

}  // namespace kvfleet::tools
