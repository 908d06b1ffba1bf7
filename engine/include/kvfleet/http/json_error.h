// JSON responses: any JSON value as a body (json_response), and OpenAI-style error bodies:
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
// Types in use: invalid_request_error (400), not_found_error (404), method_not_allowed (405),
// request_timeout (408), request_too_large (413, 431), rate_limit_error (429),
// overloaded_error (503), server_error (500).
#pragma once

#include <boost/json/fwd.hpp>
#include <string_view>

#include "kvfleet/http/message.h"

namespace kvfleet::http {

// `body` serialized, with Content-Type: application/json.
Response json_response(int status, const boost::json::value& body);

// The JSON text of the error object. An empty `param` or `code` is written as null.
std::string json_error_body(std::string_view message, std::string_view type,
                            std::string_view param = {}, std::string_view code = {});

// A response with that body and Content-Type: application/json.
Response json_error(int status, std::string_view message, std::string_view type,
                    std::string_view param = {}, std::string_view code = {});

// The usual error type for a status (400 -> invalid_request_error, 503 -> overloaded_error, ...).
std::string_view error_type_for(int status);

}  // namespace kvfleet::http
