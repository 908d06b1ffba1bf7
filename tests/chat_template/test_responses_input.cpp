// Responses API input items -> chat messages: the rule the replica and the router share.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <string>

#include "kvfleet/responses_input.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

std::string messages_of(const char* input, const ResponsesItemResolver& resolve = nullptr) {
  json::array messages;
  append_responses_messages(responses_input_items(json::parse(input)), "input", resolve, messages);
  return json::serialize(messages);
}

std::string error_param(const char* input) {
  try {
    messages_of(input);
  } catch (const ContentPartError& e) {
    return e.param;
  }
  return "";
}

}  // namespace

TEST_CASE("a string input is one user message; message items keep their role, developer becomes system") {
  CHECK(messages_of(R"("Hi")") == R"([{"role":"user","content":"Hi"}])");
  CHECK(messages_of(R"([{"role":"developer","content":"Be brief."},{"type":"message","role":"user","content":"Hi"}])") ==
        R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])");
}

TEST_CASE("content parts input_text and output_text are joined as chat joins text parts") {
  CHECK(messages_of(R"([{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
                        {"role":"assistant","content":[{"type":"output_text","text":"c","annotations":[]}]}])") ==
        R"([{"role":"user","content":"ab"},{"role":"assistant","content":"c"}])");
}

TEST_CASE("function calls join the assistant turn before them; their outputs are tool messages") {
  CHECK(messages_of(R"([{"role":"user","content":"Weather?"},
      {"role":"assistant","content":"Checking."},
      {"type":"function_call","call_id":"c1","name":"get","arguments":"{\"city\":\"Oslo\"}"},
      {"type":"function_call","call_id":"c2","name":"get","arguments":"{}"},
      {"type":"function_call_output","call_id":"c1","output":"rain"}])") ==
        R"([{"role":"user","content":"Weather?"},)"
        R"({"role":"assistant","content":"Checking.","tool_calls":[)"
        R"({"id":"c1","type":"function","function":{"name":"get","arguments":"{\"city\":\"Oslo\"}"}},)"
        R"({"id":"c2","type":"function","function":{"name":"get","arguments":"{}"}}]},)"
        R"({"role":"tool","tool_call_id":"c1","content":"rain"}])");
  // A call with no assistant text before it opens its own assistant message.
  CHECK(messages_of(R"([{"role":"user","content":"x"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}])") ==
        R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}])");
}

TEST_CASE("an item_reference is the item the resolver finds; unknown or without a resolver, an error naming it") {
  const json::object stored{{"type", "message"}, {"role", "assistant"}, {"content", "earlier"}};
  const ResponsesItemResolver resolve = [&](std::string_view id) { return id == "msg_1" ? &stored : nullptr; };
  CHECK(messages_of(R"([{"type":"item_reference","id":"msg_1"},{"role":"user","content":"and?"}])", resolve) ==
        R"([{"role":"assistant","content":"earlier"},{"role":"user","content":"and?"}])");
  CHECK_THROWS_AS(messages_of(R"([{"type":"item_reference","id":"msg_2"}])", resolve), ContentPartError);
  CHECK(error_param(R"([{"type":"item_reference","id":"msg_1"}])") == "input[0].id");
}

TEST_CASE("a reasoning item is the reasoning_content of the assistant turn it opens, as chat takes it") {
  // Content's reasoning_text first; the message and the calls after it join the same turn.
  CHECK(messages_of(R"([{"role":"user","content":"Weather?"},
      {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"short"}],
       "content":[{"type":"reasoning_text","text":"The user wants the weather."}]},
      {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
      {"type":"function_call","call_id":"c1","name":"get","arguments":"{}"},
      {"role":"user","content":"And?"}])") ==
        R"([{"role":"user","content":"Weather?"},)"
        R"({"role":"assistant","content":"Checking.","reasoning_content":"The user wants the weather.",)"
        R"("tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{}"}}]},)"
        R"({"role":"user","content":"And?"}])");
  // Summary only (what the AI SDK sends back): its summary_text parts, joined by blank lines.
  CHECK(messages_of(R"([{"role":"user","content":"x"},{"type":"reasoning","summary":[{"type":"summary_text","text":"a"},
      {"type":"summary_text","text":"b"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}])") ==
        R"([{"role":"user","content":"x"},{"role":"assistant","content":"","reasoning_content":"a\n\nb",)"
        R"("tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}])");
  // An assistant message before the reasoning is its own turn; an empty summary is an empty reasoning.
  CHECK(messages_of(R"([{"role":"assistant","content":"Hi"},{"type":"reasoning","summary":[]}])") ==
        R"([{"role":"assistant","content":"Hi"},{"role":"assistant","content":"","reasoning_content":""}])");
  // Through an item_reference (a stored reasoning item).
  const json::object stored{{"type", "reasoning"}, {"id", "rs_1"},
                            {"summary", json::array{json::object{{"type", "summary_text"}, {"text", "think"}}}}};
  const ResponsesItemResolver resolve = [&](std::string_view id) { return id == "rs_1" ? &stored : nullptr; };
  CHECK(messages_of(R"([{"type":"item_reference","id":"rs_1"},{"role":"assistant","content":"ok"}])", resolve) ==
        R"([{"role":"assistant","content":"ok","reasoning_content":"think"}])");
  // What is not taken: encrypted reasoning, a missing summary, parts of another type.
  CHECK(error_param(R"([{"type":"reasoning","summary":[],"encrypted_content":"xyz"}])") == "input[0].encrypted_content");
  CHECK(error_param(R"([{"type":"reasoning"}])") == "input[0].summary");
  CHECK(error_param(R"([{"type":"reasoning","summary":[{"type":"output_text","text":"a"}]}])") == "input[0].summary[0].type");
  CHECK(error_param(R"([{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text"}]}])") ==
        "input[0].content[0].text");
  CHECK(error_param(R"([{"type":"reasoning","summary":{}}])") == "input[0].summary");
}

TEST_CASE("what a text-only server without built-in tools cannot take is an error naming the field") {
  CHECK(error_param(R"(42)") == "input");
  CHECK(error_param(R"([])") == "input");
  CHECK(error_param(R"([{"role":"user","content":[{"type":"input_image","image_url":"x"}]}])") == "input[0].content[0].type");
  CHECK(error_param(R"([{"role":"user","content":[{"type":"input_file","file_id":"f"}]}])") == "input[0].content[0].type");
  CHECK(error_param(R"([{"type":"web_search_call","id":"w"}])") == "input[0].type");
  CHECK(error_param(R"([{"role":"tool","content":"x"}])") == "input[0].role");
  CHECK(error_param(R"([{"role":"user"}])") == "input[0].content");
  CHECK(error_param(R"([{"role":"user","content":7}])") == "input[0].content");
  CHECK(error_param(R"([{"type":"function_call","call_id":"c","name":"f"}])") == "input[0].arguments");
  CHECK(error_param(R"([{"type":"function_call_output","output":"x"}])") == "input[0].call_id");
  CHECK(error_param(R"(["hi"])") == "input[0]");
}
