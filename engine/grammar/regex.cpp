// Regex front end: the subset real JSON Schema `pattern`s and guided regexes use (see grammar.h).
#include <cctype>

#include "engine/grammar/front_ends.h"

namespace kvfleet::grammar {
namespace {

const CodeRanges kDigit{{'0', '9'}};
const CodeRanges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodeRanges kSpace{{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  RegexParser(std::string_view p, RegexText text) : p_(p), text_(text) {}

  ExprPtr parse(bool anchored) {
    bool start_anchor = false, end_anchor = false;
    if (!p_.empty() && p_[0] == '^') {
      start_anchor = true;
      i_ = 1;
    }
    if (p_.size() > i_ && p_.back() == '$' && !escaped_at(p_.size() - 1)) {
      end_anchor = true;
      p_.remove_suffix(1);
    }
    ExprPtr body = parse_alt();
    if (i_ != p_.size()) fail("unbalanced ')'");
    if (anchored) return body;
    const ExprPtr any = repeat(chars(complement({})), 0, kUnbounded);
    return seq({start_anchor ? empty() : any, body, end_anchor ? empty() : any});
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw GrammarError("regex: " + why + " at offset " + std::to_string(i_) + " of /" + std::string(p_) + "/",
                       "", "pattern");
  }
  bool escaped_at(std::size_t pos) const {
    std::size_t n = 0;
    while (pos > n && p_[pos - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  bool more() const { return i_ < p_.size(); }
  char peek() const { return p_[i_]; }

  // A character set as text: itself, or in a JSON string its escaped forms for `"`, `\` and controls.
  ExprPtr chars(const CodeRanges& ranges) const {
    const CodeRanges set = normalize(ranges);
    if (text_ == RegexText::raw) return utf8_ranges(set);
    auto has = [&](char32_t c) {
      for (const auto& [lo, hi] : set) {
        if (c >= lo && c <= hi) return true;
      }
      return false;
    };
    CodeRanges safe;
    for (auto [lo, hi] : set) {
      for (const char32_t bad : {char32_t{'"'}, char32_t{'\\'}}) {
        if (lo <= bad && bad <= hi) {
          if (lo < bad) safe.emplace_back(lo, bad - 1);
          lo = bad + 1;
        }
      }
      if (hi < 0x20 || lo > hi) continue;
      safe.emplace_back(std::max<char32_t>(lo, 0x20), hi);
    }
    std::vector<ExprPtr> out{utf8_ranges(normalize(safe))};
    if (has('"')) out.push_back(literal("\\\""));
    if (has('\\')) out.push_back(literal("\\\\"));
    static constexpr const char* kHex = "0123456789abcdef";
    for (char32_t c = 0; c < 0x20; ++c) {
      if (!has(c)) continue;
      switch (c) {
        case '\b': out.push_back(literal("\\b")); break;
        case '\f': out.push_back(literal("\\f")); break;
        case '\n': out.push_back(literal("\\n")); break;
        case '\r': out.push_back(literal("\\r")); break;
        case '\t': out.push_back(literal("\\t")); break;
        default: out.push_back(literal(std::string("\\u00") + kHex[c >> 4] + kHex[c & 15]));
      }
    }
    return alt(std::move(out));
  }

  ExprPtr parse_alt() {
    std::vector<ExprPtr> alts{parse_seq()};
    while (more() && peek() == '|') {
      ++i_;
      alts.push_back(parse_seq());
    }
    return alt(std::move(alts));
  }

  ExprPtr parse_seq() {
    std::vector<ExprPtr> items;
    while (more() && peek() != '|' && peek() != ')') items.push_back(parse_quantified());
    return seq(std::move(items));
  }

  std::size_t parse_number() {
    std::size_t n = 0, digits = 0;
    while (more() && std::isdigit(static_cast<unsigned char>(peek()))) {
      n = n * 10 + static_cast<std::size_t>(peek() - '0');
      if (++digits > 6) fail("repetition count too large");
      ++i_;
    }
    if (digits == 0) fail("expected a number");
    return n;
  }

  ExprPtr parse_quantified() {
    ExprPtr atom = parse_atom();
    while (more()) {
      std::size_t min = 0, max = 0;
      const char c = peek();
      if (c == '*') {
        min = 0, max = kUnbounded, ++i_;
      } else if (c == '+') {
        min = 1, max = kUnbounded, ++i_;
      } else if (c == '?') {
        min = 0, max = 1, ++i_;
      } else if (c == '{' && i_ + 1 < p_.size() && std::isdigit(static_cast<unsigned char>(p_[i_ + 1]))) {
        ++i_;
        min = max = parse_number();
        if (more() && peek() == ',') {
          ++i_;
          max = (more() && peek() == '}') ? kUnbounded : parse_number();
        }
        if (!more() || peek() != '}') fail("expected '}'");
        ++i_;
        if (max < min) fail("{m,n} with n < m");
      } else {
        break;
      }
      if (more() && peek() == '?') ++i_;  // lazy: the same language
      else if (more() && peek() == '+') fail("possessive quantifiers are not supported");
      atom = repeat(atom, min, max);
    }
    return atom;
  }

  std::uint32_t hex(std::size_t digits) {
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < digits; ++k) {
      if (!more() || !std::isxdigit(static_cast<unsigned char>(peek()))) fail("bad hex escape");
      const char c = peek();
      v = v * 16 + static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
      ++i_;
    }
    return v;
  }

  char32_t utf8_char() {
    const auto b = static_cast<unsigned char>(p_[i_]);
    const std::size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (std::size_t k = 1; k < len; ++k) {
      if (i_ + k >= p_.size()) fail("invalid UTF-8");
      cp = (cp << 6) | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    }
    i_ += len;
    return cp;
  }

  // After a backslash: a class escape adds its ranges; otherwise returns the one character.
  CodeRanges escape() {
    if (!more()) fail("trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 'n': return {{'\n', '\n'}};
      case 't': return {{'\t', '\t'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': {
        const char32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        char32_t v = 0;
        if (more() && peek() == '{') {
          ++i_;
          while (more() && peek() != '}') v = v * 16 + hex(1);
          ++i_;
        } else {
          v = hex(4);
        }
        return {{v, v}};
      }
      default:
        if (std::isalnum(static_cast<unsigned char>(c))) fail(std::string("unsupported escape \\") + c);
        return {{static_cast<unsigned char>(c), static_cast<unsigned char>(c)}};
    }
  }

  CodeRanges parse_class() {
    bool negate = false;
    if (more() && peek() == '^') negate = true, ++i_;
    CodeRanges ranges;
    bool first = true;
    while (true) {
      if (!more()) fail("unterminated character class");
      if (peek() == ']' && !first) break;
      first = false;
      CodeRanges one;
      if (peek() == '\\') {
        ++i_;
        one = escape();
      } else {
        const char32_t c = utf8_char();
        one = {{c, c}};
      }
      if (one.size() == 1 && one[0].first == one[0].second && i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        char32_t hi;
        if (peek() == '\\') {
          ++i_;
          const CodeRanges e = escape();
          if (e.size() != 1 || e[0].first != e[0].second) fail("a class escape cannot end a range");
          hi = e[0].first;
        } else {
          hi = utf8_char();
        }
        if (hi < one[0].first) fail("range out of order");
        one[0].second = hi;
      }
      ranges.insert(ranges.end(), one.begin(), one.end());
    }
    ++i_;
    return negate ? complement(ranges) : normalize(ranges);
  }

  ExprPtr parse_atom() {
    const char c = peek();
    if (c == '(') {
      ++i_;
      if (more() && peek() == '?') {
        ++i_;
        if (more() && peek() == ':') {
          ++i_;
        } else if (more() && (peek() == '<' || peek() == 'P')) {
          if (peek() == 'P') ++i_;
          if (!more() || peek() != '<') fail("unsupported group");
          if (i_ + 1 < p_.size() && (p_[i_ + 1] == '=' || p_[i_ + 1] == '!')) fail("lookbehind is not supported");
          while (more() && peek() != '>') ++i_;
          ++i_;
        } else {
          fail("lookaround and inline flags are not supported");
        }
      }
      ExprPtr inner = parse_alt();
      if (!more() || peek() != ')') fail("missing ')'");
      ++i_;
      return inner;
    }
    if (c == '[') {
      ++i_;
      return chars(parse_class());
    }
    if (c == '.') {
      ++i_;
      return chars(complement({{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++i_;
      if (more() && std::isdigit(static_cast<unsigned char>(peek())) && peek() != '0') fail("backreferences are not supported");
      if (more() && (peek() == 'b' || peek() == 'B')) fail("word boundaries are not supported");
      if (more() && (peek() == 'p' || peek() == 'P')) fail("unicode property classes are not supported");
      return chars(escape());
    }
    if (c == '^' || c == '$') fail("anchors are supported only at the start and end of the pattern");
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    const char32_t cp = utf8_char();
    return chars({{cp, cp}});
  }

  std::string_view p_;
  RegexText text_;
  std::size_t i_ = 0;
};

}  // namespace

ExprPtr regex_expr(std::string_view pattern, RegexText text, bool anchored) {
  return RegexParser(pattern, text).parse(anchored);
}

Grammar regex_grammar(std::string_view pattern) {
  Grammar g;
  g.root = g.add_rule("root");
  g.rules[g.root] = regex_expr(pattern, RegexText::raw, true);
  return g;
}

Grammar choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) throw GrammarError("choice: the list of choices is empty");
  std::vector<ExprPtr> alts;
  for (const std::string& c : choices) alts.push_back(literal(c));
  Grammar g;
  g.root = g.add_rule("root");
  g.rules[g.root] = alt(std::move(alts));
  return g;
}

}  // namespace kvfleet::grammar
