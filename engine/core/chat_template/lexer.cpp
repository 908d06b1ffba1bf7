#include "engine/core/chat_template/lexer.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <stdexcept>

#include "engine/core/chat_template/text.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

// Byte length of the (Python) whitespace code point starting at pos, or 0.
size_t space_len_at(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return py_isspace(c) ? 1 : 0;
  size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  auto cps = utf8_decode(s.substr(pos, n));
  return !cps.empty() && py_isspace(cps[0]) ? n : 0;
}

size_t skip_spaces(std::string_view s, size_t pos) {
  while (size_t n = space_len_at(s, pos)) pos += n;
  return pos;
}

bool all_spaces(std::string_view s) { return !s.empty() && skip_spaces(s, 0) == s.size(); }

bool starts_with(std::string_view s, size_t pos, std::string_view what) { return s.substr(pos, what.size()) == what; }

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') newlines_.push_back(i);
  }

  std::vector<Piece> run();

 private:
  int line_at(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin());
  }
  [[noreturn]] void fail(const std::string& what, size_t pos) const {
    throw TemplateError(what + " at line " + std::to_string(line_at(pos)));
  }
  // Emits text that precedes a tag, after the tag's `-` / lstrip_blocks rules.
  void emit_text(std::string text, char sign, bool is_variable, size_t pos);
  size_t lex_comment(size_t pos);
  size_t lex_raw(size_t pos);
  size_t lex_tag(size_t pos, bool is_variable);
  size_t lex_token(size_t pos, std::vector<Token>& out);
  size_t lex_string(size_t pos, Token& tok);
  size_t after_block_end(size_t pos, char sign);  // pos is just past "%}" / "#}"

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Piece> pieces_;
  bool line_starting_ = true;
};

void Lexer::emit_text(std::string text, char sign, bool is_variable, size_t pos) {
  if (sign == '-') {
    text = py_strip(text, nullptr, false, true);
  } else if (sign != '+' && !is_variable) {  // lstrip_blocks
    size_t l_pos = text.rfind('\n');
    l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
    if ((l_pos > 0 || line_starting_) && all_spaces(std::string_view(text).substr(l_pos))) text.resize(l_pos);
  }
  if (!text.empty()) pieces_.push_back(Piece{Piece::Kind::Text, std::move(text), {}, line_at(pos)});
}

size_t Lexer::after_block_end(size_t pos, char sign) {
  if (sign == '-') {
    pos = skip_spaces(src_, pos);
  } else if (sign != '+' && pos < src_.size() && src_[pos] == '\n') {  // trim_blocks
    ++pos;
  }
  line_starting_ = pos > 0 && src_[pos - 1] == '\n';
  return pos;
}

size_t Lexer::lex_comment(size_t pos) {
  size_t end = src_.find("#}", pos);
  if (end == std::string::npos) fail("missing end of comment tag", pos);
  char sign = end > pos && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
  return after_block_end(end + 2, sign);
}

size_t Lexer::lex_raw(size_t pos) {
  // pos is just past "{% raw %}"; find "{%[-+]? endraw [-+]?%}"
  for (size_t at = src_.find("{%", pos); at != std::string::npos; at = src_.find("{%", at + 2)) {
    size_t p = at + 2;
    char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p++] : 0;
    p = skip_spaces(src_, p);
    if (!starts_with(src_, p, "endraw")) continue;
    p = skip_spaces(src_, p + 6);
    char end_sign = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) end_sign = src_[p++];
    if (!starts_with(src_, p, "%}")) continue;
    emit_text(src_.substr(pos, at - pos), sign, false, pos);
    return after_block_end(p + 2, end_sign);
  }
  fail("missing end of raw directive", pos);
}

size_t Lexer::lex_string(size_t pos, Token& tok) {
  const char quote = src_[pos];
  std::string out;
  size_t p = pos + 1;
  while (true) {
    if (p >= src_.size()) fail("unterminated string", pos);
    char c = src_[p];
    if (c == quote) break;
    if (c != '\\' || p + 1 >= src_.size()) {
      out.push_back(c);
      ++p;
      continue;
    }
    char e = src_[p + 1];
    p += 2;
    auto hex = [&](int n) {
      if (p + static_cast<size_t>(n) > src_.size()) fail("bad escape in string", pos);
      // Exactly n hex digits, as Python requires (std::stoul would throw std::invalid_argument on "\\upper").
      for (size_t k = 0; k < static_cast<size_t>(n); ++k)
        if (!std::isxdigit(static_cast<unsigned char>(src_[p + k]))) fail("bad escape in string", pos);
      char32_t v = static_cast<char32_t>(std::stoul(src_.substr(p, static_cast<size_t>(n)), nullptr, 16));
      p += static_cast<size_t>(n);
      utf8_append(out, v);
    };
    switch (e) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'v': out.push_back('\v'); break;
      case '0': out.push_back('\0'); break;
      case '\n': break;  // line continuation
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default: out.push_back('\\'); out.push_back(e); break;  // Python keeps unknown escapes
    }
  }
  tok.kind = Token::Kind::String;
  tok.text = std::move(out);
  return p + 1;
}

size_t Lexer::lex_token(size_t pos, std::vector<Token>& out) {
  Token tok;
  tok.line = line_at(pos);
  char c = src_[pos];
  auto is_digit = [&](size_t p) { return p < src_.size() && src_[p] >= '0' && src_[p] <= '9'; };
  if (c == '\'' || c == '"') {
    pos = lex_string(pos, tok);
  } else if (is_digit(pos)) {
    size_t p = pos;
    while (is_digit(p) || (src_[p] == '_' && is_digit(p + 1))) ++p;
    bool is_float = false;
    if (p < src_.size() && src_[p] == '.' && is_digit(p + 1)) {
      is_float = true;
      for (++p; is_digit(p) || (src_[p] == '_' && is_digit(p + 1));) ++p;
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (is_digit(q)) {
        is_float = true;
        for (p = q; is_digit(p);) ++p;
      }
    }
    std::string digits;
    for (size_t i = pos; i < p; ++i)
      if (src_[i] != '_') digits.push_back(src_[i]);
    tok.kind = is_float ? Token::Kind::Float : Token::Kind::Int;
    try {
      if (is_float) tok.float_value = std::stod(digits);
      else tok.int_value = std::stoll(digits);
    } catch (const std::out_of_range&) {
      fail("number literal out of range", pos);
    }
    tok.text = digits;
    pos = p;
  } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
    size_t p = pos;
    while (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
    tok.kind = Token::Kind::Name;
    tok.text = src_.substr(pos, p - pos);
    pos = p;
  } else {
    static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*", "/", "%", "~", "[", "]",
                                "(", ")", "{", "}", ".", ":", ",", "|", "=", "<", ">", ";"};
    for (const char* op : ops) {
      if (starts_with(src_, pos, op)) {
        tok.kind = Token::Kind::Op;
        tok.text = op;
        pos += std::strlen(op);
        break;
      }
    }
    if (tok.kind != Token::Kind::Op) fail(std::string("unexpected char '") + c + "'", pos);
  }
  out.push_back(std::move(tok));
  return pos;
}

size_t Lexer::lex_tag(size_t pos, bool is_variable) {
  Piece piece{is_variable ? Piece::Kind::Output : Piece::Kind::Statement, {}, {}, line_at(pos)};
  std::vector<char> balance;
  const size_t start = pos;
  while (true) {
    pos = skip_spaces(src_, pos);
    if (pos >= src_.size()) fail(is_variable ? "unterminated '{{'" : "unterminated '{%'", start);
    if (balance.empty()) {
      char sign = src_[pos] == '-' || (src_[pos] == '+' && !is_variable) ? src_[pos] : 0;
      size_t p = pos + (sign ? 1 : 0);
      if (starts_with(src_, p, is_variable ? "}}" : "%}")) {
        Token end;
        end.line = line_at(pos);
        piece.tokens.push_back(end);
        pieces_.push_back(std::move(piece));
        if (is_variable) {
          pos = sign == '-' ? skip_spaces(src_, p + 2) : p + 2;
          line_starting_ = src_[pos - 1] == '\n';
          return pos;
        }
        return after_block_end(p + 2, sign);
      }
    }
    pos = lex_token(pos, piece.tokens);
    const std::string& t = piece.tokens.back().text;
    if (piece.tokens.back().kind != Token::Kind::Op) continue;
    if (t == "(" || t == "[" || t == "{") balance.push_back(t == "(" ? ')' : t == "[" ? ']' : '}');
    if (t == ")" || t == "]" || t == "}") {
      if (balance.empty() || balance.back() != t[0]) fail("unexpected '" + t + "'", pos);
      balance.pop_back();
    }
  }
}

std::vector<Piece> Lexer::run() {
  size_t pos = 0;
  while (pos < src_.size()) {
    size_t at = pos;
    while ((at = src_.find('{', at)) != std::string::npos) {
      char n = at + 1 < src_.size() ? src_[at + 1] : 0;
      if (n == '{' || n == '%' || n == '#') break;
      ++at;
    }
    if (at == std::string::npos) {
      pieces_.push_back(Piece{Piece::Kind::Text, src_.substr(pos), {}, line_at(pos)});
      break;
    }
    const char kind = src_[at + 1];
    size_t p = at + 2;
    char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p++] : 0;
    std::string text = src_.substr(pos, at - pos);
    if (kind == '%') {  // {% raw %}: no trim_blocks after it, as in jinja2
      size_t q = skip_spaces(src_, p);
      if (starts_with(src_, q, "raw")) {
        size_t r = skip_spaces(src_, q + 3);
        bool dash = starts_with(src_, r, "-%}");
        if (dash || starts_with(src_, r, "%}")) {
          emit_text(std::move(text), sign, false, pos);
          r += dash ? 3 : 2;
          if (dash) r = skip_spaces(src_, r);
          line_starting_ = src_[r - 1] == '\n';
          pos = lex_raw(r);
          continue;
        }
      }
    }
    emit_text(std::move(text), sign, kind == '{', pos);
    if (kind == '#') pos = lex_comment(p);
    else pos = lex_tag(p, kind == '{');
  }
  return std::move(pieces_);
}

}  // namespace

std::vector<Piece> lex_template(std::string_view source) {
  // jinja2 reads \r\n and \r as \n and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace kvfleet::jinja
