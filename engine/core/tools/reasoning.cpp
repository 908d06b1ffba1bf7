// qwen3 and deepseek_r1 (kvfleet/reasoning_parser.h): one rule with two ways to begin.
#include "kvfleet/reasoning_parser.h"

#include "engine/core/tools/scan_util.h"

namespace kvfleet::tools {
namespace {

constexpr std::string_view think_open = "<think>", think_close = "</think>";

// The reasoning from `begin` up to </think> (or the end of the text, less a </think> that may be arriving).
ReasoningSplit reasoning_from(std::string_view text, std::size_t begin, bool final) {
  ReasoningSplit s;
  s.has_reasoning = true;
  s.reasoning_begin = begin;
  const std::size_t close = text.find(think_close, begin);
  if (close != std::string_view::npos) {
    s.reasoning_end = close;
    s.content_begin = close + think_close.size();
  } else {
    s.reasoning_end = text.size() - (final ? 0 : held_prefix(text.substr(begin), think_close));
  }
  return s;
}

// Text that may still turn into <think>: nothing is decided yet.
bool opening_undecided(std::string_view text, bool final) {
  return !final && text.size() < think_open.size() && think_open.substr(0, text.size()) == text;
}

class Qwen3Reasoning final : public ReasoningParser {
 public:
  std::string_view name() const override { return "qwen3"; }
  ReasoningSplit split(std::string_view text, bool final) const override {
    if (opening_undecided(text, final)) return {};
    if (starts_at(text, 0, think_open)) return reasoning_from(text, think_open.size(), final);
    ReasoningSplit s;
    s.content_begin = 0;
    return s;
  }
};

class DeepSeekR1Reasoning final : public ReasoningParser {
 public:
  std::string_view name() const override { return "deepseek_r1"; }
  ReasoningSplit split(std::string_view text, bool final) const override {
    if (opening_undecided(text, final)) return {};
    return reasoning_from(text, starts_at(text, 0, think_open) ? think_open.size() : 0, final);
  }
};

}  // namespace

std::unique_ptr<ReasoningParser> make_reasoning_parser(std::string_view name) {
  if (name == "qwen3") return std::make_unique<Qwen3Reasoning>();
  if (name == "deepseek_r1") return std::make_unique<DeepSeekR1Reasoning>();
  return nullptr;
}

std::string reasoning_parser_names() { return "deepseek_r1, qwen3"; }

}  // namespace kvfleet::tools
