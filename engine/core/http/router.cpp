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

HttpRouter& HttpRouter::add_prefix(std::string method, std::string prefix, Handler handler) {
  prefixes_[std::move(prefix)][std::move(method)] = std::move(handler);
  return *this;
}

Handler HttpRouter::route(const Request& request) const {
  std::string_view path = request.path();
  const std::map<std::string, Handler>* methods = nullptr;
  if (auto exact = routes_.find(path); exact != routes_.end()) methods = &exact->second;
  // The longest prefix first: map order puts a prefix's extensions after it.
  for (auto it = prefixes_.rbegin(); !methods && it != prefixes_.rend(); ++it)
    if (path.size() > it->first.size() && path.substr(0, it->first.size()) == it->first) methods = &it->second;
  if (!methods) {
    return answer_with(json_error(404, "no route for " + std::string(path), "not_found_error"));
  }
  auto by_method = methods->find(request.method);
  if (by_method != methods->end()) return by_method->second;
  std::string allow;
  for (const auto& [method, handler] : *methods) {
    allow += (allow.empty() ? "" : ", ") + method;
  }
  Response response = json_error(405, request.method + " is not allowed on " + std::string(path),
                                 "method_not_allowed");
  response.headers.set("Allow", allow);
  return answer_with(std::move(response));
}

}  // namespace kvfleet::http
