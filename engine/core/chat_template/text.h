// UTF-8 text helpers with Python str semantics (lengths and indices count code points, whitespace
// is Python's str.isspace(), case mapping per code point via utf8proc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvfleet::jinja {

std::vector<char32_t> utf8_decode(std::string_view s);  // invalid bytes decode as U+FFFD
std::string utf8_encode(const std::vector<char32_t>& cps);
void utf8_append(std::string& out, char32_t cp);
size_t utf8_length(std::string_view s);

bool py_isspace(char32_t c);
// Python str.strip/lstrip/rstrip; `chars` null means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);  // first code point upper, the rest lower
std::string py_title(std::string_view s);       // Python str.title()
std::string jinja_title(std::string_view s);    // jinja2's title filter (words split at - space ( { [ <)
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, std::int64_t count);
// Python str.split: sep null splits on runs of whitespace.
std::vector<std::string> py_split(std::string_view s, const std::string* sep, std::int64_t maxsplit);
std::string py_repr_string(std::string_view s);
// Python's json.dumps string encoding; ensure_ascii escapes everything above 0x7e as \uXXXX.
void json_quote(std::string& out, std::string_view s, bool ensure_ascii);

}  // namespace kvfleet::jinja
