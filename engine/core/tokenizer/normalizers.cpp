// Normalizers from tokenizer.json: NFC / NFKC (utf8proc), Prepend, Replace, Sequence.
#include <utf8proc.h>

#include "engine/core/tokenizer/parts.h"

#include <boost/json.hpp>

#include <cstdlib>
#include <stdexcept>

namespace kvfleet::tok {
namespace json = boost::json;
namespace {

bool is_ascii(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;  // ASCII is already in every normal form
    utf8proc_uint8_t* result = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                static_cast<utf8proc_ssize_t>(text.size()), &result,
                                static_cast<utf8proc_option_t>(options_));
    if (n < 0) throw std::invalid_argument(std::string("tokenizer: ") + utf8proc_errmsg(n));
    text.assign(reinterpret_cast<const char*>(result), static_cast<std::size_t>(n));
    std::free(result);
  }

 private:
  int options_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceString final : public Normalizer {
 public:
  ReplaceString(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void normalize(std::string& text) const override {
    if (from_.empty() || text.find(from_) == std::string::npos) return;
    std::string out;
    out.reserve(text.size() + text.size() / 4);
    std::size_t pos = 0;
    for (std::size_t hit; (hit = text.find(from_, pos)) != std::string::npos; pos = hit + from_.size()) {
      out.append(text, pos, hit - pos).append(to_);
    }
    out.append(text, pos);
    text = std::move(out);
  }

 private:
  std::string from_;
  std::string to_;
};

class ReplaceRegex final : public Normalizer {
 public:
  ReplaceRegex(const std::string& pattern, std::string to) : regex_(pattern), to_(std::move(to)) {}
  void normalize(std::string& text) const override {
    std::vector<Span> hits;
    regex_.find_all(text, {0, text.size()}, hits);
    if (hits.empty()) return;
    std::string out;
    std::size_t pos = 0;
    for (const Span& h : hits) {
      out.append(text, pos, h.begin - pos).append(to_);
      pos = h.end;
    }
    out.append(text, pos);
    text = std::move(out);
  }

 private:
  Regex regex_;
  std::string to_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json::value& config) {
  if (config.is_null()) return nullptr;
  const json::object& obj = config.as_object();
  const std::string type(obj.at("type").as_string());
  if (type == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFKC") {
    return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  }
  if (type == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (type == "Prepend") return std::make_unique<Prepend>(std::string(obj.at("prepend").as_string()));
  if (type == "Replace") {
    const json::object& pattern = obj.at("pattern").as_object();
    std::string content(obj.at("content").as_string());
    if (const auto* s = pattern.if_contains("String")) {
      return std::make_unique<ReplaceString>(std::string(s->as_string()), std::move(content));
    }
    return std::make_unique<ReplaceRegex>(std::string(pattern.at("Regex").as_string()),
                                          std::move(content));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const json::value& step : obj.at("normalizers").as_array()) {
      if (auto n = make_normalizer(step)) steps.push_back(std::move(n));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw std::runtime_error("tokenizer: unsupported normalizer type '" + type + "'");
}

}  // namespace kvfleet::tok
