// The parsers of a forced tool_choice's constrained JSON: a named function's arguments, and required's list
// of calls; whole and streamed at every cut, agreeing; nothing is content.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "kvfleet/chat_output.h"

namespace kvfleet::tools {
namespace json = boost::json;
namespace {

struct Streamed {
  std::string content, names, args;
  std::size_t calls = 0;
};

Streamed stream(const ToolParser& p, std::string_view text, std::size_t step, bool parallel = true) {
  ToolCallStream s(p, parallel);
  Streamed out;
  auto take = [&](const StreamDelta& d) {
    out.content += d.content;
    for (const auto& c : d.calls) {
      if (c.name) {
        out.names += *c.name + ";";
        ++out.calls;
        CHECK(c.arguments.empty());
      }
      out.args += c.arguments;
    }
  };
  for (std::size_t i = 0; i < text.size(); i += step) take(s.push(text.substr(i, step)));
  take(s.finish());
  return out;
}

}  // namespace

TEST_CASE("forced tool_choice: a named function's output is its arguments, whole and streamed") {
  const auto p = make_named_call_parser("get_weather");
  const std::string text = R"({"city": "Paris", "days": [1, 2]})";
  const ParsedTools whole = parse_tool_calls(*p, text);
  REQUIRE(whole.calls.size() == 1);
  CHECK(!whole.content);
  CHECK(whole.calls[0].name == "get_weather");
  CHECK(whole.calls[0].arguments == text);
  for (std::size_t step : {1, 3, 7, 64}) {
    const Streamed s = stream(*p, " " + text, step);
    CHECK(s.content.empty());
    CHECK(s.names == "get_weather;");
    CHECK(s.args == text);
  }
  // Cut short (max_tokens): not a call; the text is the content, as for any parser.
  const ParsedTools cut = parse_tool_calls(*p, R"({"city": "Pa)");
  CHECK(cut.calls.empty());
  CHECK(cut.content == R"({"city": "Pa)");
}

TEST_CASE("forced tool_choice: required's list of calls, whole and streamed, parallel or not") {
  const auto p = make_call_list_parser();
  const std::string text =
      R"([{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name":"get_time","parameters":{}}])";
  const ParsedTools whole = parse_tool_calls(*p, text);
  REQUIRE(whole.calls.size() == 2);
  CHECK(!whole.content);
  CHECK(whole.calls[0].name == "get_weather");
  CHECK(json::parse(whole.calls[0].arguments) == json::parse(R"({"city": "Paris"})"));
  CHECK(whole.calls[1].name == "get_time");
  CHECK(whole.calls[1].arguments == "{}");
  CHECK(parse_tool_calls(*p, text, false).calls.size() == 1);
  for (std::size_t step : {1, 2, 5, 64}) {
    const Streamed s = stream(*p, text, step);
    CHECK(s.content.empty());
    CHECK(s.names == "get_weather;get_time;");
    CHECK(s.args == R"({"city": "Paris"}{})");
    CHECK(stream(*p, text, step, false).names == "get_weather;");
  }
  CHECK(parse_tool_calls(*p, "[").calls.empty());
  CHECK(parse_tool_calls(*p, R"({"name": "f"})").content == R"({"name": "f"})");  // not a list
}

}  // namespace kvfleet::tools
