// Reasoning in a model's output, as vLLM's --reasoning-parser names it: the text inside <think>...</think>
// becomes reasoning_content, the rest content.
//   qwen3:       reasoning only when the output opens with <think> (Qwen3 with thinking on); an output
//                without it is all content.
//   deepseek_r1: the output starts inside the reasoning (DeepSeek-R1's template opens <think> in the
//                prompt; a <think> the model writes itself is skipped) up to </think>; an output that never
//                closes it is all reasoning.
// Like the tool parsers, a split of a longer text only extends the split of a shorter one, so a stream
// sends differences and a whole answer is the split of the whole text.
//
// Thread-safety: immutable; split() may run on any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace kvfleet::tools {

struct ReasoningSplit {
  std::size_t reasoning_begin = 0, reasoning_end = 0;  // the reasoning: [begin, end)
  std::size_t content_begin = std::string_view::npos;  // content from here on; npos: not started yet
  bool has_reasoning = false;                          // the output has a reasoning part
};

class ReasoningParser {
 public:
  virtual ~ReasoningParser() = default;
  virtual std::string_view name() const = 0;
  // `final`: the text is the whole output (nothing held back for a tag that may still come).
  virtual ReasoningSplit split(std::string_view text, bool final) const = 0;
};

// The parser called `name`, or nullptr for an unknown name.
std::unique_ptr<ReasoningParser> make_reasoning_parser(std::string_view name);
std::string reasoning_parser_names();  // "deepseek_r1, qwen3"

}  // namespace kvfleet::tools
