#include "engine/core/chat_template/text.h"

#include <utf8proc.h>

#include <cstdio>

#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {

std::vector<char32_t> utf8_decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {  // invalid byte: take one byte as U+FFFD so that we always make progress
      cp = 0xFFFD;
      n = 1;
    }
    out.push_back(static_cast<char32_t>(cp));
    p += n;
    left -= n;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string utf8_encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // count non-continuation bytes
  return n;
}

bool py_isspace(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return true;
  if (c < 0x80) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  auto cps = utf8_decode(s);
  std::vector<char32_t> set;
  if (chars) set = utf8_decode(*chars);
  auto strip_it = [&](char32_t c) {
    if (!chars) return py_isspace(c);
    for (char32_t x : set)
      if (x == c) return true;
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode(std::vector<char32_t>(cps.begin() + static_cast<long>(b), cps.begin() + static_cast<long>(e)));
}

namespace {
char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t to_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }
bool is_cased(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
template <class F>
std::string map_cps(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : utf8_decode(s)) utf8_append(out, f(c));
  return out;
}
}  // namespace

std::string py_upper(std::string_view s) { return map_cps(s, to_upper); }
std::string py_lower(std::string_view s) { return map_cps(s, to_lower); }

std::string py_capitalize(std::string_view s) {
  bool first = true;
  return map_cps(s, [&](char32_t c) {
    char32_t r = first ? to_title(c) : to_lower(c);
    first = false;
    return r;
  });
}

std::string py_title(std::string_view s) {
  bool prev_cased = false;
  return map_cps(s, [&](char32_t c) {
    char32_t r = prev_cased ? to_lower(c) : to_title(c);
    prev_cased = is_cased(c);
    return r;
  });
}

std::string jinja_title(std::string_view s) {
  // jinja2: "".join(w[0].upper() + w[1:].lower() for w in re.split(r"([-\s({\[<]+)", s) if w)
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  bool word_start = true;
  return map_cps(s, [&](char32_t c) {
    if (is_sep(c)) {
      word_start = true;
      return c;
    }
    char32_t r = word_start ? to_upper(c) : to_lower(c);
    word_start = false;
    return r;
  });
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, std::int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts repl between every code point and at both ends
    auto cps = utf8_decode(s);
    std::int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) out.append(repl), ++done;
      utf8_append(out, c);
    }
    if (count < 0 || done < count) out.append(repl);
    return out;
  }
  size_t pos = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos)).append(repl);
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, std::int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw TemplateError("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<std::int64_t>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  auto cps = utf8_decode(s);
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && py_isspace(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {
      size_t e = n;
      while (e > i && py_isspace(cps[e - 1])) --e;
      out.push_back(utf8_encode({cps.begin() + static_cast<long>(i), cps.begin() + static_cast<long>(e)}));
      break;
    }
    size_t j = i;
    while (j < n && !py_isspace(cps[j])) ++j;
    out.push_back(utf8_encode({cps.begin() + static_cast<long>(i), cps.begin() + static_cast<long>(j)}));
    i = j;
  }
  return out;
}

namespace {
bool py_printable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}
}  // namespace

std::string py_repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (py_printable(c)) {
      utf8_append(out, c);
    } else {
      const char* fmt = c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x";
      std::snprintf(buf, sizeof buf, fmt, static_cast<unsigned>(c));
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

void json_quote(std::string& out, std::string_view s, bool ensure_ascii) {
  char buf[16];
  out.push_back('"');
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      if (c >= 0x10000) {  // a surrogate pair, as Python writes it
        char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back('"');
}

}  // namespace kvfleet::jinja
