#include "engine/core/tools/scan_util.h"

#include <boost/json.hpp>
#include <cctype>
#include <random>

namespace kvfleet::tools {
namespace json = boost::json;

std::size_t held_prefix(std::string_view text, std::string_view marker) {
  for (std::size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

std::size_t skip_ws(std::string_view text, std::size_t pos) {
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t' || text[pos] == '\r')) ++pos;
  return pos;
}

bool starts_at(std::string_view text, std::size_t pos, std::string_view s) {
  return pos <= text.size() && text.substr(pos, s.size()) == s;
}

namespace {

bool valid_json(std::string_view text) {
  json::error_code ec;
  json::parse(text, ec);
  return !ec;
}

// From an opening quote: the position after the closing one, or npos when the text ends first.
std::size_t string_end(std::string_view text, std::size_t pos) {
  for (std::size_t i = pos + 1; i < text.size(); ++i) {
    if (text[i] == '\\') ++i;
    else if (text[i] == '"') return i + 1;
  }
  return std::string_view::npos;
}

}  // namespace

ValueSpan scan_json_value(std::string_view text, std::size_t pos, bool final) {
  ValueSpan v;
  v.begin = skip_ws(text, pos);
  v.end = text.size();
  if (v.begin >= text.size()) {
    v.state = final ? Span::invalid : Span::incomplete;
    return v;
  }
  const char c = text[v.begin];
  std::size_t end = std::string_view::npos;
  if (c == '{' || c == '[') {
    int depth = 0;
    for (std::size_t i = v.begin; i < text.size() && end == std::string_view::npos; ++i) {
      if (text[i] == '"') {
        i = string_end(text, i);
        if (i == std::string_view::npos) break;
        --i;
      } else if (text[i] == '{' || text[i] == '[') {
        ++depth;
      } else if ((text[i] == '}' || text[i] == ']') && --depth == 0) {
        end = i + 1;
      }
    }
  } else if (c == '"') {
    end = string_end(text, v.begin);
  } else {
    std::size_t i = v.begin;
    while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '.' || text[i] == '-' ||
                               text[i] == '+'))
      ++i;
    if (i == v.begin) {
      v.state = Span::invalid;
      return v;
    }
    if (i < text.size() || final) end = i;
  }
  if (end == std::string_view::npos) {
    v.state = final ? Span::invalid : Span::incomplete;
    return v;
  }
  v.end = end;
  v.state = valid_json(text.substr(v.begin, end - v.begin)) ? Span::complete : Span::invalid;
  return v;
}

CallObject scan_call_object(std::string_view text, std::size_t pos, bool final) {
  CallObject out;
  pos = skip_ws(text, pos);
  auto incomplete = [&] {
    out.state = final ? Span::invalid : Span::incomplete;
    return out;
  };
  auto invalid = [&] {
    out.state = Span::invalid;
    return out;
  };
  if (pos >= text.size()) return incomplete();
  if (text[pos] != '{') return invalid();
  ++pos;
  bool first = true;
  while (true) {
    pos = skip_ws(text, pos);
    if (pos >= text.size()) return incomplete();
    if (text[pos] == '}') {
      if (out.call.name.empty()) return invalid();
      out.state = Span::complete;
      out.end = pos + 1;
      out.call.complete = true;
      if (out.call.arguments.empty()) out.call.arguments = "{}";
      return out;
    }
    if (!first) {
      if (text[pos] != ',') return invalid();
      pos = skip_ws(text, pos + 1);
      if (pos >= text.size()) return incomplete();
    }
    first = false;
    if (text[pos] != '"') return invalid();
    const std::size_t key_end = string_end(text, pos);
    if (key_end == std::string_view::npos) return incomplete();
    json::error_code ec;
    const json::value key = json::parse(text.substr(pos, key_end - pos), ec);
    if (ec) return invalid();
    pos = skip_ws(text, key_end);
    if (pos >= text.size()) return incomplete();
    if (text[pos] != ':') return invalid();
    const ValueSpan v = scan_json_value(text, pos + 1, final);
    if (v.state == Span::invalid) return invalid();
    const std::string_view raw = text.substr(v.begin, v.end - v.begin);
    const std::string_view k = key.as_string();
    if (k == "name") {
      if (v.state == Span::incomplete) return incomplete();
      const json::value name = json::parse(raw);
      if (!name.is_string() || name.as_string().empty()) return invalid();
      out.call.name = name.as_string();
    } else if (k == "arguments" || k == "parameters") {
      if (!raw.empty() && raw.front() == '"') {  // arguments as a JSON string holding JSON
        if (v.state == Span::incomplete) return incomplete();
        const json::value s = json::parse(raw);
        if (!valid_json(s.as_string())) return invalid();
        out.call.arguments = s.as_string();
      } else {
        out.call.arguments = raw;
      }
    }
    if (v.state == Span::incomplete) return incomplete();
    pos = v.end;
  }
}

std::string random_call_id(const char* prefix, int n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::uniform_int_distribution<int> pick(0, 61);
  std::string id = prefix;
  for (int i = 0; i < n; ++i) id += alphabet[pick(rng)];
  return id;
}

const json::value& function_of(const json::value& tool) {
  if (tool.is_object())
    if (const json::value* f = tool.as_object().if_contains("function"); f && f->is_object()) return *f;
  return tool;
}

}  // namespace kvfleet::tools
