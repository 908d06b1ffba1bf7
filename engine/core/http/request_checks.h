// Internal: what the server checks of a request beyond Beast's syntax, and how a failed read is
// answered. Shared by the session and the fuzz target so that both run the same rules.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/system/error_code.hpp>
#include <string>

namespace kvfleet::http {

// A status and a message for the client; status 0: nothing to answer.
struct ReadFailure {
  int status = 0;
  std::string message;
  explicit operator bool() const { return status != 0; }
};

// RFC 9112's framing and Host rules on a parsed request head (Beast accepts some of these):
//  - Transfer-Encoding must end in `chunked`, once (else 400: the body length cannot be known, and
//    reading it as empty would run the body as a second request); other codings before it: 501;
//    not in HTTP/1.0 (400); never together with Content-Length (400).
//  - Content-Length: exactly one field of digits (no lists, duplicates or signs), else 400.
//  - Host: exactly one in HTTP/1.1, at most one in HTTP/1.0, with a valid value, else 400.
ReadFailure check_request_head(const boost::beast::http::request_header<>& head);

// True for an HTTP/1.1 request with `Expect: 100-continue`.
bool expects_continue(const boost::beast::http::request_header<>& head);

// The answer to a failed parse (ParseError, Beast's http::error); 400 for anything else malformed.
ReadFailure parse_failure(boost::system::error_code ec);

}  // namespace kvfleet::http
