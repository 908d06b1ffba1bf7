#include "kvfleet/http/json_error.h"

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

namespace kvfleet::http {

Response json_response(int status, const boost::json::value& body) {
  return Response::json(status, boost::json::serialize(body));
}

std::string json_error_body(std::string_view message, std::string_view type, std::string_view param,
                            std::string_view code) {
  boost::json::object error;
  error["message"] = message;
  error["type"] = type;
  error["param"] = param.empty() ? boost::json::value(nullptr) : boost::json::value(param);
  error["code"] = code.empty() ? boost::json::value(nullptr) : boost::json::value(code);
  boost::json::object root;
  root["error"] = std::move(error);
  return boost::json::serialize(root);
}

Response json_error(int status, std::string_view message, std::string_view type, std::string_view param,
                    std::string_view code) {
  return Response::json(status, json_error_body(message, type, param, code));
}

std::string_view error_type_for(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 404: return "not_found_error";
    case 405: return "method_not_allowed";
    case 408: return "request_timeout";
    case 413:
    case 431: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

}  // namespace kvfleet::http
