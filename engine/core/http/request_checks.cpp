#include "request_checks.h"

#include <algorithm>
#include <cctype>
#include <string_view>
#include <vector>

#include "bounded_parser.h"
#include "kvfleet/http/message.h"

namespace kvfleet::http {

namespace bhttp = boost::beast::http;
using boost::system::error_code;

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The transfer codings of every Transfer-Encoding field, in order (parameters dropped, empty list
// elements skipped as RFC 9110 5.6.1 allows).
std::vector<std::string> transfer_codings(const bhttp::request_header<>& head) {
  std::vector<std::string> codings;
  for (const auto& field : head) {
    if (field.name() != bhttp::field::transfer_encoding) continue;
    std::string_view rest(field.value().data(), field.value().size());
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view element = rest.substr(0, comma);
      element = trim(element.substr(0, element.find(';')));
      if (!element.empty()) {
        std::string lower(element);
        std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
        codings.push_back(std::move(lower));
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return codings;
}

size_t count_fields(const bhttp::request_header<>& head, bhttp::field name) {
  auto [first, last] = head.equal_range(name);
  return static_cast<size_t>(std::distance(first, last));
}

ReadFailure check_transfer_encoding(const bhttp::request_header<>& head) {
  std::vector<std::string> codings = transfer_codings(head);
  if (head.version() < 11) return {400, "Transfer-Encoding is not allowed in an HTTP/1.0 request"};
  if (count_fields(head, bhttp::field::content_length) > 0) {
    return {400, "a request must not have both Content-Length and Transfer-Encoding"};
  }
  if (codings.empty() || codings.back() != "chunked") {
    return {400, "Transfer-Encoding must end in chunked"};
  }
  if (std::count(codings.begin(), codings.end(), "chunked") > 1) {
    return {400, "chunked must be applied only once"};
  }
  if (codings.size() > 1) return {501, "transfer coding '" + codings.front() + "' is not supported"};
  return {};
}

ReadFailure check_content_length(const bhttp::request_header<>& head) {
  size_t count = count_fields(head, bhttp::field::content_length);
  if (count == 0) return {};
  if (count > 1) return {400, "more than one Content-Length"};
  auto value = head[bhttp::field::content_length];
  bool digits = !value.empty() && value.size() <= 19 &&
                std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) return {400, "invalid Content-Length"};
  return {};
}

// reg-name / IP-literal / IPv4 with an optional port: unreserved, sub-delims, '%', ':', '[', ']'.
bool valid_host(std::string_view host) {
  return std::all_of(host.begin(), host.end(), [](unsigned char c) {
    return std::isalnum(c) || std::string_view("-._~!$&'()*+,;=%:[]").find(char(c)) != std::string_view::npos;
  });
}

ReadFailure check_host(const bhttp::request_header<>& head) {
  size_t count = count_fields(head, bhttp::field::host);
  if (count == 0 && head.version() >= 11) return {400, "an HTTP/1.1 request must have a Host header"};
  if (count > 1) return {400, "more than one Host header"};
  if (count == 1) {
    auto value = head[bhttp::field::host];
    if (!valid_host(std::string_view(value.data(), value.size()))) return {400, "invalid Host header"};
  }
  return {};
}

}  // namespace

ReadFailure check_request_head(const bhttp::request_header<>& head) {
  if (head.find(bhttp::field::transfer_encoding) != head.end()) {
    if (ReadFailure failure = check_transfer_encoding(head)) return failure;
  }
  if (ReadFailure failure = check_content_length(head)) return failure;
  return check_host(head);
}

bool expects_continue(const bhttp::request_header<>& head) {
  auto expect = head.find(bhttp::field::expect);
  if (head.version() < 11 || expect == head.end()) return false;
  auto value = expect->value();
  return iequals(trim(std::string_view(value.data(), value.size())), "100-continue");
}

ReadFailure parse_failure(error_code ec) {
  if (ec == ParseError::head_too_large || ec == bhttp::error::header_limit) {
    return {431, "request line and headers are too large"};
  }
  if (ec == ParseError::trailer_too_large) return {431, "request trailers are too large"};
  if (ec == ParseError::field_too_large) return {431, "a request header field is too large"};
  if (ec == ParseError::chunk_line_too_long || ec == ParseError::chunk_extensions_too_long) {
    return {400, "chunk extensions are too long"};
  }
  if (ec == bhttp::error::body_limit) return {413, "request body is too large"};
  return {400, "malformed HTTP request: " + ec.message()};
}

namespace {

class ParseErrorCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "kvfleet.http.parse"; }
  std::string message(int value) const override {
    switch (static_cast<ParseError>(value)) {
      case ParseError::head_too_large: return "head too large";
      case ParseError::trailer_too_large: return "trailers too large";
      case ParseError::chunk_line_too_long: return "chunk line too long";
      case ParseError::chunk_extensions_too_long: return "chunk extensions too long";
      case ParseError::field_too_large: return "field too large";
    }
    return "parse error";
  }
};

}  // namespace

const boost::system::error_category& parse_error_category() {
  static const ParseErrorCategory category;
  return category;
}

}  // namespace kvfleet::http
