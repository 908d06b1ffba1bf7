// Reasoning (qwen3, deepseek_r1) and tool calls after it, whole and streamed at every cut.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "kvfleet/chat_output.h"
#include "kvfleet/chat_tools.h"

namespace kvfleet::tools {
namespace json = boost::json;
namespace {

struct Streamed {
  std::string reasoning, content, call_names, call_args;
};

Streamed stream(const ChatOutputOptions& o, std::string_view text, std::size_t step) {
  ChatOutputStream s(o);
  Streamed out;
  auto take = [&](const ChatDelta& d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (const auto& c : d.calls) {
      if (c.name) out.call_names += *c.name + ";";
      out.call_args += c.arguments;
    }
  };
  for (std::size_t i = 0; i < text.size(); i += step) take(s.push(text.substr(i, step)));
  take(s.finish());
  return out;
}

void check_same(const ChatOutputOptions& o, std::string_view text) {
  const ChatOutputParts whole = parse_chat_output(text, o);
  std::string names, args;
  for (const auto& c : whole.calls) {
    names += c.name + ";";
    args += c.arguments;
  }
  for (std::size_t step : {1, 2, 5, 64}) {
    CAPTURE(step);
    const Streamed s = stream(o, text, step);
    CHECK(s.reasoning == whole.reasoning.value_or(""));
    CHECK(s.content == whole.content.value_or(""));
    CHECK(s.call_names == names);
    CHECK(s.call_args == args);
  }
}

}  // namespace

TEST_CASE("qwen3: <think> at the start is reasoning; an output without it is all content") {
  const auto r = make_reasoning_parser("qwen3");
  REQUIRE(r);
  const ChatOutputOptions o{r.get(), nullptr, true};
  ChatOutputParts p = parse_chat_output("<think>\nThe user greets me.\n</think>\n\nHello!", o);
  CHECK(p.reasoning == "\nThe user greets me.\n");
  CHECK(p.content == "\n\nHello!");
  p = parse_chat_output("Hello!", o);
  CHECK_FALSE(p.reasoning);
  CHECK(p.content == "Hello!");
  p = parse_chat_output("<think>cut short by max_tokens", o);
  CHECK(p.reasoning == "cut short by max_tokens");
  CHECK_FALSE(p.content);
  check_same(o, "<think>\nThe user greets me.\n</think>\n\nHello!");
  check_same(o, "<thin is not a tag");
  check_same(o, "Hello!");
}

TEST_CASE("deepseek_r1: the output starts inside the reasoning, up to </think>") {
  const auto r = make_reasoning_parser("deepseek_r1");
  const ChatOutputOptions o{r.get(), nullptr, true};
  ChatOutputParts p = parse_chat_output("Okay, 1+1 is 2.\n</think>\n\nThe answer is 2.", o);
  CHECK(p.reasoning == "Okay, 1+1 is 2.\n");
  CHECK(p.content == "\n\nThe answer is 2.");
  p = parse_chat_output("<think>Hmm.</think>Two.", o);
  CHECK(p.reasoning == "Hmm.");
  CHECK(p.content == "Two.");
  p = parse_chat_output("never closed", o);
  CHECK(p.reasoning == "never closed");
  CHECK_FALSE(p.content);
  check_same(o, "Okay, 1+1 is 2.\n</think>\n\nThe answer is 2.");
  check_same(o, "<think>Hmm.</think>Two.");
}

TEST_CASE("tool calls are parsed after the reasoning ends; markup inside the reasoning is not a call") {
  const auto r = make_reasoning_parser("qwen3");
  const auto t = make_tool_parser("hermes");
  const ChatOutputOptions o{r.get(), t.get(), true};
  const std::string text =
      "<think>\nI could write <tool_call> here but I am only thinking.\n</think>\n\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const ChatOutputParts p = parse_chat_output(text, o);
  CHECK(p.reasoning == "\nI could write <tool_call> here but I am only thinking.\n");
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].name == "get_weather");
  CHECK_FALSE(p.content);  // "\n\n" before the call is no content
  check_same(o, text);
}

TEST_CASE("prepare_chat_tools: the template's tools section, else the parser's instructions, else refused") {
  const auto with_tools = ChatTemplate::from_string(
      "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
      "{% for m in messages %}{{ m.role }}: {{ m.content }}"
      "{% if m.tool_calls %}{% for c in m.tool_calls %}[{{ c.function.arguments.city }}]{% endfor %}{% endif %}\n"
      "{% endfor %}");
  const auto plain = ChatTemplate::from_string("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
  CHECK(template_renders_tools(with_tools));
  CHECK_FALSE(template_renders_tools(plain));
  const json::value tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{}}}])");
  json::array messages = json::parse(R"([{"role":"user","content":"hi"},
    {"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function",
      "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]}])").as_array();
  ChatTemplateOptions opts;
  json::array m1 = messages;
  prepare_chat_tools(m1, opts, tools, true, nullptr);
  // The arguments reach the template as an object, as Hugging Face templates expect.
  CHECK(with_tools.render(m1, opts) == "TOOLS:get_weather;user: hiassistant: [Paris]");
  json::array m2 = messages;
  ChatTemplateOptions opts2;
  const auto hermes = make_tool_parser("hermes");
  prepare_chat_tools(m2, opts2, tools, false, hermes.get());
  CHECK(opts2.tools.is_null());
  const std::string rendered = plain.render(m2, opts2);
  CHECK(rendered.starts_with("system: # Tools\n"));
  CHECK(rendered.find("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"") != std::string::npos);
  json::array m3 = messages;
  ChatTemplateOptions opts3;
  CHECK_THROWS_AS(prepare_chat_tools(m3, opts3, tools, false, nullptr), ToolsNotRenderable);
  // No tools: nothing to refuse.
  CHECK_NOTHROW(prepare_chat_tools(m3, opts3, json::value(), false, nullptr));
}

TEST_CASE("request_tools: the legacy functions become tools") {
  const json::object body = json::parse(R"({"functions":[{"name":"f","parameters":{"type":"object"}}]})").as_object();
  CHECK(request_tools(body) == json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])"));
  CHECK(request_tools(json::object{}).is_null());
}

}  // namespace kvfleet::tools
