#include "kvfleet/http/json_error.h"
#include "kvfleet/http/server.h"

namespace kvfleet::http {

namespace {

// A plain function, not a capturing lambda coroutine: the response is a parameter, so it lives in
// the coroutine frame rather than in a closure that could go away first.
boost::asio::awaitable<void> send_response(Response response, ResponseWriter& writer) {
  co_await writer.send(std::move(response));
}

Handler answer_with(Response response) {
  return [response = std::move(response)](const Request&, ResponseWriter& writer) {
    return send_response(response, writer);
  };
}

}  // namespace

HttpRouter& HttpRouter::add(std::string method, std::string path, Handler handler) {
  routes_[std::move(path)][std::move(method)] = std::move(handler);
  return *this;
}

Handler HttpRouter::route(const Request& request) const {
  std::string_view path = request.path();
  auto by_path = routes_.find(path);
  if (by_path == routes_.end()) {
    return answer_with(json_error(404, "no route for " + std::string(path), "not_found_error"));
  }
  auto by_method = by_path->second.find(request.method);
  if (by_method != by_path->second.end()) return by_method->second;
  std::string allow;
  for (const auto& [method, handler] : by_path->second) {
    allow += (allow.empty() ? "" : ", ") + method;
  }
  Response response = json_error(405, request.method + " is not allowed on " + std::string(path),
                                 "method_not_allowed");
  response.headers.set("Allow", allow);
  return answer_with(std::move(response));
}

}  // namespace kvfleet::http
