#include "kvfleet/http/sse.h"

namespace kvfleet::http {

std::string sse_format(std::string_view data, std::string_view event) {
  std::string out;
  out.reserve(data.size() + 16);
  if (!event.empty()) {
    out.append("event: ").append(event).append("\n");
  }
  for (;;) {
    size_t nl = data.find('\n');
    out.append("data: ").append(data.substr(0, nl)).append("\n");
    if (nl == std::string_view::npos) break;
    data.remove_prefix(nl + 1);
  }
  out.append("\n");
  return out;
}

std::vector<SseEvent> SseParser::feed(std::string_view bytes) {
  std::vector<SseEvent> out;
  for (char c : bytes) {
    if (skip_lf_) {
      skip_lf_ = false;
      if (c == '\n') continue;  // second half of "\r\n", already handled
    }
    if (c == '\r' || c == '\n') {
      skip_lf_ = (c == '\r');
      on_line(line_, out);
      line_.clear();
    } else {
      if (limits_.max_line > 0 && line_.size() >= limits_.max_line) {
        throw SseLimitError("SSE line over " + std::to_string(limits_.max_line) + " bytes");
      }
      line_.push_back(c);
    }
  }
  return out;
}

void SseParser::on_line(std::string_view line, std::vector<SseEvent>& out) {
  if (line.empty()) {  // blank line: dispatch (the spec drops events without data)
    if (has_data_) out.push_back(std::move(current_));
    current_ = {};
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment / keep-alive ping
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field == "data") {
    if (has_data_) current_.data.push_back('\n');
    current_.data.append(value);
    has_data_ = true;
    if (limits_.max_event > 0 && current_.data.size() > limits_.max_event) {
      throw SseLimitError("SSE event over " + std::to_string(limits_.max_event) + " bytes");
    }
  } else if (field == "event") {
    current_.event = std::string(value);
  } else if (field == "id") {
    current_.id = std::string(value);
  }
}

}  // namespace kvfleet::http
