// pythonic: Llama 3.2/4 and others write their calls as a Python list of calls with keyword arguments,
// the whole output (optionally between <|python_start|> and <|python_end|>):
//   [get_weather(city="Paris", unit='celsius'), get_time(zone=None)]
// Arguments are Python literals (strings, numbers, True/False/None, lists, tuples, dicts), turned into
// JSON. A call's arguments are known when its ')' arrives. Output that does not open with '[' is content.
#include <boost/json.hpp>
#include <cctype>

#include "engine/core/tools/formats.h"
#include "engine/core/tools/scan_util.h"

namespace kvfleet::tools {
namespace json = boost::json;
namespace {

constexpr std::string_view python_start = "<|python_start|>", python_end = "<|python_end|>";

// Recursive descent over a text that may stop anywhere: `eof` records that it did.
class PyReader {
 public:
  explicit PyReader(std::string_view text, std::size_t pos) : t_(text), p_(pos) {}
  bool eof = false;
  std::size_t pos() const { return p_; }

  void ws() { p_ = skip_ws(t_, p_); }
  // The next character after whitespace, 0 at the end (and eof set).
  char peek() {
    ws();
    if (p_ >= t_.size()) {
      eof = true;
      return 0;
    }
    return t_[p_];
  }
  bool take(char c) {
    if (peek() != c) return false;
    ++p_;
    return true;
  }
  std::optional<std::string> identifier() {
    ws();
    const std::size_t b = p_;
    while (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '_' || t_[p_] == '.')) ++p_;
    if (p_ >= t_.size()) eof = true;
    if (p_ == b || std::isdigit(static_cast<unsigned char>(t_[b]))) return std::nullopt;
    return std::string(t_.substr(b, p_ - b));
  }
  std::optional<json::value> value() {
    const char c = peek();
    if (c == '"' || c == '\'') return string();
    if (c == '[' || c == '(') return sequence(c == '[' ? ']' : ')');
    if (c == '{') return dict();
    if (c == '-' || c == '+' || std::isdigit(static_cast<unsigned char>(c))) return number();
    const auto word = identifier();
    if (!word) return std::nullopt;
    if (*word == "True") return json::value(true);
    if (*word == "False") return json::value(false);
    if (*word == "None") return json::value(nullptr);
    return std::nullopt;
  }

 private:
  std::optional<json::value> string() {
    const char q = t_[p_++];
    std::string out;
    while (p_ < t_.size() && t_[p_] != q) {
      char c = t_[p_++];
      if (c == '\\') {
        if (p_ >= t_.size()) break;
        const char e = t_[p_++];
        c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
      }
      out += c;
    }
    if (p_ >= t_.size()) {
      eof = true;
      return std::nullopt;
    }
    ++p_;
    return json::value(out);
  }
  std::optional<json::value> number() {
    const std::size_t b = p_;
    while (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '.' || t_[p_] == '-' ||
                              t_[p_] == '+'))
      ++p_;
    if (p_ >= t_.size()) {
      eof = true;
      return std::nullopt;
    }
    json::error_code ec;
    json::value v = json::parse(t_.substr(b, p_ - b), ec);
    if (ec || !v.is_number()) return std::nullopt;
    return v;
  }
  std::optional<json::value> sequence(char close) {
    ++p_;
    json::array out;
    while (!take(close)) {
      if (!out.empty() && !take(',')) return std::nullopt;
      if (take(close)) break;  // a trailing comma
      auto v = value();
      if (!v) return std::nullopt;
      out.push_back(std::move(*v));
    }
    return json::value(std::move(out));
  }
  std::optional<json::value> dict() {
    ++p_;
    json::object out;
    while (!take('}')) {
      if (!out.empty() && !take(',')) return std::nullopt;
      if (take('}')) break;
      auto key = value();
      if (!key || !key->is_string() || !take(':')) return std::nullopt;
      auto v = value();
      if (!v) return std::nullopt;
      out[key->as_string()] = std::move(*v);
    }
    return json::value(std::move(out));
  }

  std::string_view t_;
  std::size_t p_;
};

class PythonicParser final : public ToolParser {
 public:
  std::string_view name() const override { return "pythonic"; }

  ToolScan scan(std::string_view text, bool final) const override {
    ToolScan s;
    std::size_t p = skip_ws(text, 0);
    if (starts_at(text, p, python_start)) p = skip_ws(text, p + python_start.size());
    const std::string_view rest = text.substr(p);
    if (rest.empty() || python_start.substr(0, rest.size()) == rest) {
      s.content_end = final ? text.size() : 0;  // undecided until more comes
      return s;
    }
    if (text[p] != '[') {
      s.content_end = text.size();
      return s;
    }
    s.started = true;
    PyReader r(text, p + 1);
    // The text ran out (fine unless final) or broke the grammar.
    auto stop = [&] {
      if (!r.eof || final) s.valid = false;
      return s;
    };
    while (!r.take(']')) {
      if (!s.calls.empty() && !r.take(',')) return stop();
      const auto name = r.identifier();
      if (!name || !r.take('(')) return stop();
      s.calls.push_back({*name, "", false});
      json::object args;
      while (!r.take(')')) {
        if (!args.empty() && !r.take(',')) return stop();
        if (r.take(')')) break;
        const auto key = r.identifier();
        if (!key || !r.take('=')) return stop();
        auto v = r.value();
        if (!v) return stop();
        args[*key] = std::move(*v);
      }
      s.calls.back().arguments = json::serialize(args);
      s.calls.back().complete = true;
    }
    std::size_t end = skip_ws(text, r.pos());
    if (starts_at(text, end, python_end)) end = skip_ws(text, end + python_end.size());
    if (end < text.size() && python_end.substr(0, text.size() - end) != text.substr(end)) s.valid = false;
    if (s.calls.empty() && final) s.valid = false;
    return s;
  }

  std::string tools_prompt(const boost::json::array& tools) const override {
    return "You can call these functions:\n" + tools_lines(tools) +
           "\nTo call functions, answer only with a Python list of calls with keyword arguments: "
           "[func_name1(param1=value1, param2=value2), func_name2(param=value)]";
  }
};

}  // namespace

std::unique_ptr<ToolParser> make_pythonic_parser() { return std::make_unique<PythonicParser>(); }

}  // namespace kvfleet::tools
