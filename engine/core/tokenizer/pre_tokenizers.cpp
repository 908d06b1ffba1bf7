// Pre-tokenizers from tokenizer.json: Split (PCRE2 regex or literal, all five delimiter behaviours,
// invert), ByteLevel, Metaspace, Digits, Sequence. Semantics follow Hugging Face tokenizers (Rust).
//
// ByteLevel does not rewrite bytes into GPT-2's printable characters here: that mapping is a bijection,
// so the BPE model applies it implicitly (its vocab is keyed by raw bytes), which saves a copy of every
// piece. Only the prefix space and the GPT-2 regex split happen at this stage.
#include "engine/core/tokenizer/parts.h"

#include <boost/json.hpp>

#include <stdexcept>

namespace kvfleet::tok {
namespace json = boost::json;

const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace {

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior parse_behavior(std::string_view name) {
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  throw std::runtime_error("tokenizer: unknown Split behavior '" + std::string(name) + "'");
}

struct Piece {
  Span span;
  bool delimiter;
};

// Applies a delimiter behaviour to the pieces of one span (gaps and matches in order).
void apply_behavior(const std::vector<Piece>& pieces, Behavior behavior, std::vector<Span>& out) {
  bool previous_delim = false;
  const std::size_t first_out = out.size();
  switch (behavior) {
    case Behavior::removed:
      for (const Piece& p : pieces) {
        if (!p.delimiter) out.push_back(p.span);
      }
      return;
    case Behavior::isolated:
      for (const Piece& p : pieces) out.push_back(p.span);
      return;
    case Behavior::contiguous:
      for (const Piece& p : pieces) {
        if (p.delimiter && previous_delim && out.size() > first_out) {
          out.back().end = p.span.end;
        } else {
          out.push_back(p.span);
        }
        previous_delim = p.delimiter;
      }
      return;
    case Behavior::merged_with_previous:
      for (const Piece& p : pieces) {
        if (p.delimiter && !previous_delim && out.size() > first_out) {
          out.back().end = p.span.end;
        } else {
          out.push_back(p.span);
        }
        previous_delim = p.delimiter;
      }
      return;
    case Behavior::merged_with_next: {
      std::vector<Span> reversed;
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->delimiter && !previous_delim && !reversed.empty()) {
          reversed.back().begin = it->span.begin;
        } else {
          reversed.push_back(it->span);
        }
        previous_delim = it->delimiter;
      }
      out.insert(out.end(), reversed.rbegin(), reversed.rend());
      return;
    }
  }
}

class Split final : public PreTokenizer {
 public:
  Split(const json::object& config)
      : behavior_(parse_behavior(config.at("behavior").as_string())),
        invert_(config.contains("invert") && config.at("invert").as_bool()) {
    const json::object& pattern = config.at("pattern").as_object();
    if (const auto* s = pattern.if_contains("String")) {
      literal_ = std::string(s->as_string());
    } else {
      regex_ = std::make_unique<Regex>(std::string(pattern.at("Regex").as_string()));
    }
  }
  Split(const std::string& regex, Behavior behavior)
      : behavior_(behavior), regex_(std::make_unique<Regex>(regex)) {}

  void apply(Pieces& pieces, bool) const override {
    std::vector<Span> out;
    out.reserve(pieces.spans.size() * 4);
    std::vector<Span> matches;
    std::vector<Piece> parts;
    for (const Span& span : pieces.spans) {
      matches.clear();
      find(pieces.text, span, matches);
      parts.clear();
      std::size_t pos = span.begin;
      for (const Span& m : matches) {
        if (m.begin > pos) parts.push_back({{pos, m.begin}, invert_});
        parts.push_back({m, !invert_});
        pos = m.end;
      }
      if (pos < span.end) parts.push_back({{pos, span.end}, invert_});
      apply_behavior(parts, behavior_, out);
    }
    pieces.spans = std::move(out);
  }

 private:
  void find(const std::string& text, Span span, std::vector<Span>& out) const {
    if (regex_) return regex_->find_all(text, span, out);
    if (literal_.empty()) return;
    const std::string_view view(text.data(), span.end);
    for (std::size_t hit = view.find(literal_, span.begin); hit != std::string_view::npos;
         hit = view.find(literal_, hit + literal_.size())) {
      out.push_back({hit, hit + literal_.size()});
    }
  }

  Behavior behavior_;
  bool invert_ = false;
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// Rebuilds pieces.text with `prefix` inserted before every piece for which want_prefix(piece) holds.
template <typename Pred>
void prefix_pieces(Pieces& pieces, std::string_view prefix, Pred want_prefix) {
  std::string text;
  text.reserve(pieces.text.size() + prefix.size() * 2);
  for (Span& span : pieces.spans) {
    const std::string_view piece(pieces.text.data() + span.begin, span.end - span.begin);
    const std::size_t begin = text.size();
    if (want_prefix(piece)) text.append(prefix);
    text.append(piece);
    span = {begin, text.size()};
  }
  pieces.text = std::move(text);
}

class ByteLevel final : public PreTokenizer {
 public:
  explicit ByteLevel(const json::object& config) {
    const auto* prefix = config.if_contains("add_prefix_space");
    add_prefix_space_ = prefix && prefix->is_bool() && prefix->as_bool();
    const auto* use_regex = config.if_contains("use_regex");
    if (!use_regex || !use_regex->is_bool() || use_regex->as_bool()) {
      split_ = std::make_unique<Split>(kGpt2Pattern, Behavior::isolated);
    }
  }
  void apply(Pieces& pieces, bool first_section) const override {
    if (add_prefix_space_) {
      prefix_pieces(pieces, " ", [](std::string_view p) { return p.empty() || p[0] != ' '; });
    }
    if (split_) split_->apply(pieces, first_section);
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_ = false;
  std::unique_ptr<Split> split_;
};

class Metaspace final : public PreTokenizer {
 public:
  explicit Metaspace(const json::object& config) {
    if (const auto* r = config.if_contains("replacement")) replacement_ = std::string(r->as_string());
    if (const auto* scheme = config.if_contains("prepend_scheme")) {
      scheme_ = std::string(scheme->as_string());
    } else if (const auto* add = config.if_contains("add_prefix_space")) {
      scheme_ = add->as_bool() ? "always" : "never";
    }
    if (const auto* split = config.if_contains("split")) split_ = split->as_bool();
  }
  void apply(Pieces& pieces, bool first_section) const override {
    std::string text;
    text.reserve(pieces.text.size() + pieces.text.size() / 4 + replacement_.size());
    const bool prepend = scheme_ == "always" || (scheme_ == "first" && first_section);
    std::vector<Span> spans;
    for (const Span& span : pieces.spans) {
      const std::size_t begin = text.size();
      const std::string_view piece(pieces.text.data() + span.begin, span.end - span.begin);
      if (prepend && piece.substr(0, replacement_.size()) != replacement_ && !piece.starts_with(' ')) {
        text.append(replacement_);
      }
      std::size_t word_begin = begin;
      for (const char c : piece) {
        if (c != ' ') {
          text.push_back(c);
          continue;
        }
        // A space becomes the replacement and starts a new piece (MergedWithNext) when splitting.
        if (split_ && text.size() > word_begin) {
          spans.push_back({word_begin, text.size()});
          word_begin = text.size();
        }
        text.append(replacement_);
      }
      if (text.size() > word_begin) spans.push_back({word_begin, text.size()});
    }
    pieces.text = std::move(text);
    pieces.spans = std::move(spans);
  }

 private:
  std::string replacement_ = "\xE2\x96\x81";  // U+2581
  std::string scheme_ = "always";
  bool split_ = true;
};

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void apply(Pieces& pieces, bool first_section) const override {
    for (const auto& step : steps_) step->apply(pieces, first_section);
  }
  bool byte_level() const override {
    for (const auto& step : steps_) {
      if (step->byte_level()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json::value& config) {
  if (config.is_null()) return nullptr;
  const json::object& obj = config.as_object();
  const std::string type(obj.at("type").as_string());
  if (type == "Split") return std::make_unique<Split>(obj);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(obj);
  if (type == "Metaspace") return std::make_unique<Metaspace>(obj);
  if (type == "Digits") {
    const auto* individual = obj.if_contains("individual_digits");
    const bool each = individual && individual->as_bool();
    return std::make_unique<Split>(each ? "\\p{N}" : "\\p{N}+", Behavior::isolated);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const json::value& step : obj.at("pretokenizers").as_array()) {
      if (auto p = make_pre_tokenizer(step)) steps.push_back(std::move(p));
    }
    return std::make_unique<SequencePre>(std::move(steps));
  }
  throw std::runtime_error("tokenizer: unsupported pre_tokenizer type '" + type + "'");
}

}  // namespace kvfleet::tok
