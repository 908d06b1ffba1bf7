// Server-sent events: formatting on the producing side, incremental parsing on the reading side.
// The parser accepts input split anywhere (even inside "\r\n") and yields whole events only.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvfleet::http {

struct SseEvent {
  std::string event;  // "event:" field, empty when absent
  std::string data;   // "data:" lines joined with '\n'
  std::string id;     // "id:" field, empty when absent
};

// "data: <data>\n\n"; a data string with newlines becomes several data lines.
std::string sse_format(std::string_view data, std::string_view event = {});

// Bounds on what a peer may make the parser hold; 0: no bound. A reader of a peer it does not
// control (the router reading a replica's events) should set both.
struct SseLimits {
  size_t max_line = 0;   // bytes of one line (field name and value)
  size_t max_event = 0;  // bytes of one event's data (all its data lines)
};

// Thrown by SseParser::feed when a limit is exceeded; the stream is then unusable.
class SseLimitError : public std::length_error {
 public:
  using std::length_error::length_error;
};

class SseParser {
 public:
  SseParser() = default;
  explicit SseParser(SseLimits limits) : limits_(limits) {}

  // Consumes `bytes` and returns the events they complete, in order. Throws SseLimitError.
  std::vector<SseEvent> feed(std::string_view bytes);
  // Bytes held back because they do not yet end in a line break.
  size_t pending_bytes() const { return line_.size(); }

 private:
  void on_line(std::string_view line, std::vector<SseEvent>& out);

  SseLimits limits_;
  std::string line_;       // the unfinished line
  bool skip_lf_ = false;   // the last byte was '\r': a following '\n' belongs to it
  SseEvent current_;
  bool has_data_ = false;  // current_ has at least one data line
};

}  // namespace kvfleet::http
