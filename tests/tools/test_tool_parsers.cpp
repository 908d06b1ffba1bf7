// The tool-call parsers on the output formats of the models they serve (the strings vLLM's parser tests
// use), whole and streamed: every stream, cut at every byte, adds up to the whole answer, and never shows
// markup as content.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "kvfleet/tool_parser.h"

namespace kvfleet::tools {
namespace json = boost::json;
namespace {

struct Expected {
  std::optional<std::string> content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (compared as JSON)
};

// A stream's deltas put together, as a client assembles them.
struct Assembled {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;
  std::vector<std::string> ids;
};

Assembled stream(const ToolParser& p, std::string_view text, std::size_t step, bool parallel = true) {
  ToolCallStream s(p, parallel);
  Assembled a;
  auto take = [&](const StreamDelta& d) {
    a.content += d.content;
    for (const auto& c : d.calls) {
      if (c.id) {
        REQUIRE(c.index == a.calls.size());  // the first delta of a call: index, id, name, ""
        REQUIRE(c.name);
        CHECK(c.arguments.empty());
        a.calls.emplace_back(*c.name, "");
        a.ids.push_back(*c.id);
      } else {
        REQUIRE(c.index < a.calls.size());
        CHECK_FALSE(c.name);
        a.calls[c.index].second += c.arguments;
      }
    }
  };
  for (std::size_t i = 0; i < text.size(); i += step) take(s.push(text.substr(i, step)));
  take(s.finish());
  return a;
}

void check_parse(std::string_view parser, std::string_view text, const Expected& want, bool parallel = true) {
  CAPTURE(text);
  const auto p = make_tool_parser(parser);
  REQUIRE(p);
  const ParsedTools got = parse_tool_calls(*p, text, parallel);
  CHECK(got.content == want.content);
  REQUIRE(got.calls.size() == want.calls.size());
  for (std::size_t i = 0; i < want.calls.size(); ++i) {
    CHECK(got.calls[i].name == want.calls[i].first);
    CHECK(json::parse(got.calls[i].arguments) == json::parse(want.calls[i].second));
    CHECK(got.calls[i].id.size() >= 9);
  }
  for (std::size_t step : {std::size_t(1), std::size_t(3), std::size_t(7), text.size()}) {
    CAPTURE(step);
    const Assembled a = stream(*p, text, step == 0 ? 1 : step, parallel);
    CHECK(a.content == want.content.value_or(got.calls.empty() ? std::string(text) : a.content));
    if (!got.calls.empty() && got.content) CHECK(a.content == *got.content);
    REQUIRE(a.calls.size() == got.calls.size());
    for (std::size_t i = 0; i < a.calls.size(); ++i) {
      CHECK(a.calls[i].first == got.calls[i].name);
      CHECK(a.calls[i].second == got.calls[i].arguments);  // the same text, streamed or not
    }
  }
}

}  // namespace

TEST_CASE("hermes: Qwen's <tool_call> blocks, with content before them, parallel, and broken JSON") {
  check_parse("hermes",
              "<tool_call>\n{\"name\": \"get_current_weather\", \"arguments\": {\"city\": \"Dallas\", \"state\": \"TX\", "
              "\"unit\": \"fahrenheit\"}}\n</tool_call>",
              {std::nullopt, {{"get_current_weather", R"({"city": "Dallas", "state": "TX", "unit": "fahrenheit"})"}}});
  check_parse("hermes",
              "Let me check the weather.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
              "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>",
              {"Let me check the weather.\n", {{"get_weather", R"({"city": "Paris"})"}, {"get_time", R"({"zone": "CET"})"}}});
  // parallel_tool_calls false: the first call only.
  check_parse("hermes",
              "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
              "\"arguments\": {}}\n</tool_call>",
              {std::nullopt, {{"a", "{}"}}}, false);
  // Arguments written as a JSON string, and a call that never got its closing tag.
  check_parse("hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}",
              {std::nullopt, {{"f", R"({"x": 1})"}}});
  // Not a call after all: the whole output is content.
  const std::string broken = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>";
  const auto p = make_tool_parser("hermes");
  const ParsedTools whole = parse_tool_calls(*p, broken);
  CHECK(whole.content == broken);
  CHECK(whole.calls.empty());
  // A stream cannot take back a call it announced: it keeps the call as far as its arguments went.
  const Assembled streamed = stream(*p, broken, 1);
  REQUIRE(streamed.calls.size() == 1);
  CHECK(streamed.calls[0].second == "{\"x\": ");
  CHECK(streamed.content.empty());
  // Broken before the name is complete: content, streamed or not.
  const std::string early = "<tool_call>\n{\"name\" 12}</tool_call>";
  check_parse("hermes", early, {early, {}});
  check_parse("hermes", "The answer is 4. Use <b>bold</b>.", {"The answer is 4. Use <b>bold</b>.", {}});
}

TEST_CASE("hermes: a stream holds back what may become <tool_call> and never sends markup as content") {
  const auto p = make_tool_parser("hermes");
  ToolCallStream s(*p, true);
  CHECK(s.push("Sure <tool").content == "Sure");  // the space waits: it may end the content
  const StreamDelta d = s.push("_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa");
  CHECK(d.content == " ");
  REQUIRE(d.calls.size() == 2);
  CHECK(d.calls[0].id->starts_with("call_"));
  CHECK(*d.calls[0].name == "get_weather");
  CHECK(d.calls[1].arguments == "{\"city\": \"Pa");
  const StreamDelta e = s.push("ris\"}}\n</tool_call>");
  REQUIRE(e.calls.size() == 1);
  CHECK(e.calls[0].arguments == "ris\"}");
  CHECK(s.finish().empty());
  CHECK(s.called());
  // "<tool" that turns out to be text is sent once it cannot be a tag.
  ToolCallStream t(*p, true);
  CHECK(t.push("a <too").content == "a");
  CHECK(t.push("l> b").content == " <tool> b");
}

TEST_CASE("llama3_json: a JSON object as the whole output, with parameters, <|python_tag|>, several by ';'") {
  check_parse("llama3_json", R"({"name": "get_weather", "parameters": {"city": "San Francisco", "metric": "celsius"}})",
              {std::nullopt, {{"get_weather", R"({"city": "San Francisco", "metric": "celsius"})"}}});
  check_parse("llama3_json",
              R"(<|python_tag|>{"name": "searchTool", "parameters": {"query": "a"}}; {"name": "getOpenIncidentsTool", "parameters": {}})",
              {std::nullopt, {{"searchTool", R"({"query": "a"})"}, {"getOpenIncidentsTool", "{}"}}});
  check_parse("llama3_json", "The capital of France is Paris.", {"The capital of France is Paris.", {}});
  check_parse("llama3_json", "{not json}", {"{not json}", {}});
}

TEST_CASE("mistral: [TOOL_CALLS] with a JSON list (before v11) and name[ARGS]{...} (v11 on)") {
  check_parse("mistral", R"([TOOL_CALLS][{"name": "add", "arguments": {"a": 3.5, "b": 4}}])",
              {std::nullopt, {{"add", R"({"a": 3.5, "b": 4})"}}});
  check_parse("mistral",
              R"(Let me add. [TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "multiply", "arguments": {"a": 3, "b": 6}}])",
              {"Let me add. ", {{"add", R"({"a": 1, "b": 2})"}, {"multiply", R"({"a": 3, "b": 6})"}}});
  check_parse("mistral", R"([TOOL_CALLS]add_this_and_that[ARGS]{"a": 3.5, "b": 4})",
              {std::nullopt, {{"add_this_and_that", R"({"a": 3.5, "b": 4})"}}});
  check_parse("mistral", R"([TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{})",
              {std::nullopt, {{"get_weather", R"({"city": "Paris"})"}, {"get_time", "{}"}}});
  const auto p = make_tool_parser("mistral");
  CHECK(p->needs_special_tokens());
  const std::string id = p->make_call_id();
  CHECK(id.size() == 9);  // Mistral's templates check tool_call_id for 9 letters and digits
}

TEST_CASE("deepseek_v3: calls between DeepSeek's own tokens, with ```json fences") {
  const std::string one =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  check_parse("deepseek_v3", one, {std::nullopt, {{"get_weather", R"({"city": "Tokyo"})"}}});
  const std::string two =
      "I'll look both up.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Tokyo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n"
      "{\"zone\": \"JST\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  check_parse("deepseek_v3", two,
              {"I'll look both up.", {{"get_weather", R"({"city": "Tokyo"})"}, {"get_time", R"({"zone": "JST"})"}}});
  check_parse("deepseek_v3", "No tools needed.", {"No tools needed.", {}});
}

TEST_CASE("pythonic: a Python list of calls, literals turned into JSON") {
  check_parse("pythonic", "[get_weather(city='San Francisco', metric='celsius')]",
              {std::nullopt, {{"get_weather", R"({"city": "San Francisco", "metric": "celsius"})"}}});
  check_parse("pythonic",
              "[register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, role=None, "
              "passed_test=True, aliases=['John', 'Johnny'])]",
              {std::nullopt,
               {{"register_user", R"({"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"},
                                      "role": null, "passed_test": true, "aliases": ["John", "Johnny"]})"}}});
  check_parse("pythonic", "[get_weather(city=\"Paris\"), do_something_cool(steps=[])]",
              {std::nullopt, {{"get_weather", R"({"city": "Paris"})"}, {"do_something_cool", R"({"steps": []})"}}});
  check_parse("pythonic", "<|python_start|>[get_time()]<|python_end|>", {std::nullopt, {{"get_time", "{}"}}});
  check_parse("pythonic", "[1] is a citation.", {"[1] is a citation.", {}});
  check_parse("pythonic", "Hello there.", {"Hello there.", {}});
}

TEST_CASE("make_tool_parser knows vLLM's names and nothing else") {
  for (const char* n : {"hermes", "llama3_json", "mistral", "deepseek_v3", "pythonic"}) CHECK(make_tool_parser(n));
  CHECK_FALSE(make_tool_parser("qwen"));
  CHECK_FALSE(make_tool_parser(""));
}

}  // namespace kvfleet::tools
