// Plain HTTP request/response values shared by the server, the client and handlers. They carry no
// Beast types, so code that only handles requests does not pay Beast's compile time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvfleet::http {

// Header names compare case-insensitively (RFC 9110); order and duplicates are kept.
class Headers {
 public:
  struct Field {
    std::string name;
    std::string value;
  };

  Headers() = default;
  Headers(std::initializer_list<Field> fields) : fields_(fields) {}

  // First value of `name`, or nullptr.
  const std::string* find(std::string_view name) const;
  // Replaces every field called `name` with one field.
  void set(std::string_view name, std::string_view value);
  void add(std::string_view name, std::string_view value) {
    fields_.push_back({std::string(name), std::string(value)});
  }
  bool erase(std::string_view name);

  const std::vector<Field>& fields() const { return fields_; }
  bool empty() const { return fields_.empty(); }

 private:
  std::vector<Field> fields_;
};

bool iequals(std::string_view a, std::string_view b);

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path plus optional "?query"
  Headers headers;
  std::string body;
  // Set by HttpServer: the client connected from a loopback address (127.0.0.0/8, ::1, ::ffff:127.x).
  bool from_loopback = false;

  // The target without its query string.
  std::string_view path() const;
  // The raw (not percent-decoded) value of query parameter `name`, if present.
  std::optional<std::string> query_param(std::string_view name) const;
};

struct Response {
  int status = 200;
  Headers headers;
  std::string body;

  static Response json(int status, std::string body);
  static Response text(int status, std::string body, std::string_view content_type = "text/plain");
};

// "Not Found" for 404 and so on; "" for codes we do not know.
std::string_view reason_phrase(int status);

}  // namespace kvfleet::http
