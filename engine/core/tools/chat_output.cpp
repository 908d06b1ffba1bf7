#include "kvfleet/chat_output.h"

namespace kvfleet::tools {

ChatOutputParts parse_chat_output(std::string_view text, const ChatOutputOptions& o) {
  ChatOutputParts parts;
  std::string_view content = text;
  if (o.reasoning) {
    const ReasoningSplit s = o.reasoning->split(text, true);
    if (s.has_reasoning) parts.reasoning = std::string(text.substr(s.reasoning_begin, s.reasoning_end - s.reasoning_begin));
    content = s.content_begin == std::string_view::npos ? std::string_view() : text.substr(s.content_begin);
  }
  if (o.tools) {
    ParsedTools t = parse_tool_calls(*o.tools, content, o.parallel_tool_calls);
    parts.calls = std::move(t.calls);
    parts.content = std::move(t.content);
    if (parts.content && parts.content->empty() && parts.reasoning) parts.content.reset();
  } else if (!content.empty() || !parts.reasoning) {
    parts.content = std::string(content);
  }
  return parts;
}

ChatOutputStream::ChatOutputStream(const ChatOutputOptions& options) : options_(options) {
  if (options_.tools) tools_.emplace(*options_.tools, options_.parallel_tool_calls);
}

ChatDelta ChatOutputStream::push(std::string_view piece) { return step(piece, false); }
ChatDelta ChatOutputStream::finish() { return step({}, true); }

ChatDelta ChatOutputStream::step(std::string_view piece, bool final) {
  text_ += piece;
  ChatDelta d;
  std::string_view content = text_;
  if (options_.reasoning) {
    const ReasoningSplit s = options_.reasoning->split(text_, final);
    const std::size_t from = s.reasoning_begin + reasoning_sent_;
    if (s.has_reasoning && s.reasoning_end > from) {
      d.reasoning = text_.substr(from, s.reasoning_end - from);
      reasoning_sent_ += d.reasoning.size();
    }
    content = s.content_begin == std::string_view::npos ? std::string_view() : content.substr(s.content_begin);
  }
  const std::string_view fresh = content.substr(std::min(content_fed_, content.size()));
  content_fed_ = content.size();
  if (!tools_) {
    d.content = fresh;
    return d;
  }
  StreamDelta t = tools_->push(fresh);
  if (final) {
    StreamDelta rest = tools_->finish();
    t.content += rest.content;
    t.calls.insert(t.calls.end(), rest.calls.begin(), rest.calls.end());
  }
  d.content = std::move(t.content);
  d.calls = std::move(t.calls);
  return d;
}

}  // namespace kvfleet::tools
