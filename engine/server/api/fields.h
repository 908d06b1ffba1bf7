// Typed access to the optional fields of a request object, each failure a 400 naming the field (param).
// Internal to the request parsers (api/request.cpp, api/chat.cpp).
#pragma once

#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "engine/server/api/request.h"

namespace kvfleet::server {

class Fields {
 public:
  // `prefix` names the object in messages and params ("stream_options." -> "stream_options.include_usage").
  explicit Fields(const boost::json::object& o, std::string prefix = {}) : o_(o), prefix_(std::move(prefix)) {}

  std::string name(const char* key) const { return prefix_ + key; }

  const boost::json::value* find(const char* key) const {
    const boost::json::value* v = o_.if_contains(key);
    return v && !v->is_null() ? v : nullptr;
  }
  std::optional<double> number(const char* key, double lo, double hi) const {
    const boost::json::value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw bad_request("'" + name(key) + "' must be a number", name(key));
    const double d = v->to_number<double>();
    if (!(d >= lo && d <= hi) || !std::isfinite(d))
      throw bad_request("'" + name(key) + "' must be between " + fmt(lo) + " and " + fmt(hi) + ", got " + fmt(d), name(key));
    return d;
  }
  std::optional<std::int64_t> integer(const char* key, std::int64_t lo, std::int64_t hi) const {
    const boost::json::value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_int64() && !v->is_uint64()) throw bad_request("'" + name(key) + "' must be an integer", name(key));
    if (v->is_uint64() && v->as_uint64() > static_cast<std::uint64_t>(hi))
      throw bad_request("'" + name(key) + "' must be at most " + std::to_string(hi), name(key));
    const std::int64_t i = v->is_int64() ? v->as_int64() : static_cast<std::int64_t>(v->as_uint64());
    if (i < lo || i > hi)
      throw bad_request("'" + name(key) + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                            ", got " + std::to_string(i), name(key));
    return i;
  }
  std::optional<bool> boolean(const char* key) const {
    const boost::json::value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_bool()) throw bad_request("'" + name(key) + "' must be true or false", name(key));
    return v->as_bool();
  }
  std::optional<std::string> string(const char* key) const {
    const boost::json::value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw bad_request("'" + name(key) + "' must be a string", name(key));
    return std::string(v->as_string());
  }
  const boost::json::object* object(const char* key) const {
    const boost::json::value* v = find(key);
    if (!v) return nullptr;
    if (!v->is_object()) throw bad_request("'" + name(key) + "' must be an object", name(key));
    return &v->as_object();
  }
  const boost::json::array* array(const char* key) const {
    const boost::json::value* v = find(key);
    if (!v) return nullptr;
    if (!v->is_array()) throw bad_request("'" + name(key) + "' must be a list", name(key));
    return &v->as_array();
  }

 private:
  static std::string fmt(double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", d);
    return buf;
  }
  const boost::json::object& o_;
  std::string prefix_;
};

}  // namespace kvfleet::server
