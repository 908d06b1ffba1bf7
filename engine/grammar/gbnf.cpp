// GBNF front end (llama.cpp's grammar syntax; see grammar.h).
#include <cctype>
#include <unordered_map>

#include "engine/grammar/front_ends.h"

namespace kvfleet::grammar {
namespace {

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : s_(text) {}

  Grammar parse() {
    skip_space(true);
    while (more()) {
      const std::string name = parse_name();
      skip_space(false);
      if (s_.substr(i_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
      i_ += 3;
      skip_space(true);
      const int rule = rule_id(name);
      if (g_.rules[rule]) fail("rule '" + name + "' is defined twice");
      g_.rules[rule] = parse_alternatives(false);
      if (more() && s_[i_] != '\n' && s_[i_] != '\r') fail("unexpected character");
      skip_space(true);
    }
    const auto root = ids_.find("root");
    if (root == ids_.end() || !g_.rules[root->second]) throw GrammarError("gbnf: no 'root' rule");
    g_.root = root->second;
    for (std::size_t r = 0; r < g_.rules.size(); ++r) {
      if (!g_.rules[r]) throw GrammarError("gbnf: rule '" + g_.names[r] + "' is used but not defined");
    }
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    std::size_t line = 1;
    for (std::size_t k = 0; k < i_ && k < s_.size(); ++k) line += s_[k] == '\n';
    throw GrammarError("gbnf: " + why + " (line " + std::to_string(line) + ")");
  }
  bool more() const { return i_ < s_.size(); }

  void skip_space(bool newlines) {
    while (more()) {
      const char c = s_[i_];
      if (c == '#') {
        while (more() && s_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++i_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

  std::string parse_name() {
    const std::size_t start = i_;
    while (more() && name_char(s_[i_])) ++i_;
    if (start == i_) fail("expected a rule name");
    return std::string(s_.substr(start, i_ - start));
  }

  int rule_id(const std::string& name) {
    const auto [it, inserted] = ids_.try_emplace(name, 0);
    if (inserted) it->second = g_.add_rule(name);
    return it->second;
  }

  ExprPtr parse_alternatives(bool nested) {
    std::vector<ExprPtr> alts{parse_sequence(nested)};
    while (more() && s_[i_] == '|') {
      ++i_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    return alt(std::move(alts));
  }

  ExprPtr parse_sequence(bool nested) {
    std::vector<ExprPtr> items;
    while (more()) {
      const char c = s_[i_];
      ExprPtr item;
      if (c == '"') {
        ++i_;
        std::string text;
        while (more() && s_[i_] != '"') append_char(text);
        if (!more()) fail("unterminated literal");
        ++i_;
        item = literal(text);
      } else if (c == '[') {
        ++i_;
        item = utf8_ranges(parse_class());
      } else if (c == '.') {
        ++i_;
        item = utf8_ranges(complement({}));
      } else if (c == '(') {
        ++i_;
        skip_space(true);
        item = parse_alternatives(true);
        if (!more() || s_[i_] != ')') fail("expected ')'");
        ++i_;
      } else if (name_char(c)) {
        const std::size_t save = i_;
        const std::string name = parse_name();
        skip_space(false);
        if (s_.substr(i_, 3) == "::=") {  // the next rule starts: this sequence is over
          i_ = save;
          break;
        }
        i_ = save + name.size();
        item = ref(rule_id(name));
      } else {
        break;
      }
      item = parse_postfix(item);
      items.push_back(item);
      skip_space(nested);
    }
    return seq(std::move(items));
  }

  std::size_t number() {
    std::size_t n = 0, digits = 0;
    while (more() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      n = n * 10 + static_cast<std::size_t>(s_[i_++] - '0');
      if (++digits > 6) fail("repetition count too large");
    }
    if (digits == 0) fail("expected a number");
    return n;
  }

  ExprPtr parse_postfix(ExprPtr item) {
    while (more()) {
      const char c = s_[i_];
      if (c == '*') item = repeat(item, 0, kUnbounded);
      else if (c == '+') item = repeat(item, 1, kUnbounded);
      else if (c == '?') item = optional(item);
      else if (c == '{') {
        ++i_;
        skip_space(false);
        const std::size_t min = number();
        std::size_t max = min;
        skip_space(false);
        if (more() && s_[i_] == ',') {
          ++i_;
          skip_space(false);
          max = (more() && s_[i_] == '}') ? kUnbounded : number();
          skip_space(false);
        }
        if (!more() || s_[i_] != '}') fail("expected '}'");
        if (max < min) fail("{m,n} with n < m");
        item = repeat(item, min, max);
      } else {
        break;
      }
      ++i_;
    }
    return item;
  }

  char32_t hex(std::size_t digits) {
    char32_t v = 0;
    for (std::size_t k = 0; k < digits; ++k) {
      if (!more() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) fail("bad hex escape");
      const char c = s_[i_++];
      v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
    }
    return v;
  }

  // One character (escape or UTF-8) as a code point.
  char32_t next_char() {
    if (s_[i_] == '\\') {
      ++i_;
      if (!more()) fail("trailing backslash");
      const char c = s_[i_++];
      switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '^': return static_cast<unsigned char>(c);
        default: fail(std::string("unknown escape \\") + c);
      }
    }
    const auto b = static_cast<unsigned char>(s_[i_]);
    const std::size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (std::size_t k = 1; k < len; ++k) {
      if (i_ + k >= s_.size()) fail("invalid UTF-8");
      cp = (cp << 6) | (static_cast<unsigned char>(s_[i_ + k]) & 0x3F);
    }
    i_ += len;
    return cp;
  }

  void append_char(std::string& out) {
    const bool escaped = s_[i_] == '\\';
    const char32_t cp = next_char();
    if (escaped && cp < 0x100 && s_[i_ - 3] == 'x') out.push_back(static_cast<char>(cp));  // \xHH: a raw byte
    else append_utf8(out, cp);
  }

  CodeRanges parse_class() {
    bool negate = false;
    if (more() && s_[i_] == '^') negate = true, ++i_;
    CodeRanges ranges;
    while (more() && s_[i_] != ']') {
      const char32_t lo = next_char();
      char32_t hi = lo;
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        hi = next_char();
        if (hi < lo) fail("range out of order");
      }
      ranges.emplace_back(lo, hi);
    }
    if (!more()) fail("unterminated character class");
    ++i_;
    return negate ? complement(ranges) : normalize(ranges);
  }

  std::string_view s_;
  std::size_t i_ = 0;
  Grammar g_;
  std::unordered_map<std::string, int> ids_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text) { return GbnfParser(text).parse(); }

}  // namespace kvfleet::grammar
