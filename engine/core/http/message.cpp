#include "kvfleet/http/message.h"

#include <algorithm>

namespace kvfleet::http {

namespace {
char lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }
}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}

const std::string* Headers::find(std::string_view name) const {
  for (const Field& f : fields_) {
    if (iequals(f.name, name)) return &f.value;
  }
  return nullptr;
}

void Headers::set(std::string_view name, std::string_view value) {
  erase(name);
  add(name, value);
}

bool Headers::erase(std::string_view name) {
  auto removed = std::erase_if(fields_, [&](const Field& f) { return iequals(f.name, name); });
  return removed > 0;
}

std::string_view Request::path() const {
  std::string_view t = target;
  return t.substr(0, t.find('?'));
}

std::optional<std::string> Request::query_param(std::string_view name) const {
  std::string_view t = target;
  size_t q = t.find('?');
  if (q == std::string_view::npos) return std::nullopt;
  std::string_view rest = t.substr(q + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      return std::string(eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1));
    }
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return std::nullopt;
}

Response Response::json(int status, std::string body) {
  return text(status, std::move(body), "application/json");
}

Response Response::text(int status, std::string body, std::string_view content_type) {
  Response r;
  r.status = status;
  r.headers.set("Content-Type", content_type);
  r.body = std::move(body);
  return r;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

}  // namespace kvfleet::http
