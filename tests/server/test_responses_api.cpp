// The Responses API's pieces without a process: request parsing into the chat body it runs as, the chat
// answer turned into the response object and its typed stream events, and the bounded store.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <regex>

#include "engine/server/api/request.h"
#include "engine/server/api/responses.h"
#include "engine/server/responses/store.h"
#include "engine/server/responses/translate.h"

using namespace kvfleet::server;
namespace json = boost::json;

namespace {

ResponsesRequest parse(const char* body, ResponsesCapabilities can = {}) {
  return parse_responses_request(parse_json_body(body), can);
}

// The param of the 400 that parsing `body` throws ("(none)" when it throws none).
std::string refused(const char* body, ResponsesCapabilities can = {}) {
  try {
    parse(body, can);
  } catch (const ApiError& e) {
    CHECK(e.status == 400);
    return e.param;
  }
  return "(none)";
}

// The event types of an SSE text, in order, each checked to carry its sequence number.
std::vector<std::string> event_types(const std::string& sse, std::int64_t& next_sequence) {
  std::vector<std::string> types;
  const std::regex event("event: ([a-z_.]+)\ndata: (.*)\n\n");
  for (auto it = std::sregex_iterator(sse.begin(), sse.end(), event); it != std::sregex_iterator(); ++it) {
    const json::object data = json::parse((*it)[2].str()).as_object();
    CHECK(data.at("type").as_string() == (*it)[1].str());
    CHECK(data.at("sequence_number") == next_sequence++);
    types.push_back((*it)[1].str());
  }
  return types;
}

json::object chunk(const char* text) { return json::parse(text).as_object(); }

ResponseShell shell() { return {"resp_1", 1700000000, "tiny", parse(R"({"input":"x"})").echo}; }

}  // namespace

TEST_CASE("a Responses request becomes the chat body it runs as, and the fields the response repeats") {
  const auto r = parse(R"({"model":"tiny","input":"Hi","instructions":"Be brief.","max_output_tokens":7,
    "temperature":0.5,"top_p":0.9,"seed":3,"top_k":4,"stream":true,"store":false,"metadata":{"k":"v"},
    "user":"u","previous_response_id":"resp_0","truncation":"auto","parallel_tool_calls":false})");
  CHECK(r.model == "tiny");
  CHECK(json::serialize(r.input) == R"([{"type":"message","role":"user","content":"Hi"}])");
  CHECK(r.instructions == "Be brief.");
  CHECK(r.previous_response_id == "resp_0");
  CHECK(!r.store);
  CHECK(r.stream);
  CHECK(r.truncate);
  CHECK(r.chat.at("max_tokens") == 7);
  CHECK(r.chat.at("temperature") == 0.5);
  CHECK(r.chat.at("seed") == 3);
  CHECK(r.chat.at("top_k") == 4);
  CHECK(r.chat.at("stream_options").at("include_usage") == true);
  CHECK(!r.chat.contains("tools"));
  CHECK(r.echo.at("max_output_tokens") == 7);
  CHECK(r.echo.at("metadata").at("k") == "v");
  CHECK(r.echo.at("store") == false);
  CHECK(r.echo.at("parallel_tool_calls") == false);
  CHECK(r.echo.at("truncation") == "auto");
  CHECK(r.echo.at("tool_choice") == "auto");
  CHECK(r.echo.at("text").at("format").at("type") == "text");
  const auto d = parse(R"({"input":"Hi"})");
  CHECK(d.store);
  CHECK(!d.chat.contains("max_tokens"));
  CHECK(d.echo.at("temperature") == 1.0);
  CHECK(d.echo.at("instructions").is_null());
  CHECK(d.echo.at("previous_response_id").is_null());
}

TEST_CASE("every OpenAI field this server does not serve is a 400 naming it") {
  CHECK(refused(R"({})") == "input");
  CHECK(refused(R"({"input":5})") == "input");
  CHECK(refused(R"({"input":"x","background":true})") == "background");
  CHECK(refused(R"({"input":"x","include":["message.output_text.logprobs"]})") == "include");
  CHECK(refused(R"({"input":"x","conversation":"c"})") == "conversation");
  CHECK(refused(R"({"input":"x","prompt":{"id":"p"}})") == "prompt");
  CHECK(refused(R"({"input":"x","top_logprobs":2})") == "top_logprobs");
  CHECK(refused(R"({"input":"x","service_tier":"flex"})") == "service_tier");
  CHECK(refused(R"({"input":"x","reasoning":{"effort":"high"}})") == "reasoning.effort");
  CHECK(refused(R"({"input":"x","text":{"format":{"type":"xml"}}})") == "text.format.type");
  CHECK(refused(R"({"input":"x","text":{"verbosity":"low"}})") == "text.verbosity");
  CHECK(refused(R"({"input":"x","tools":[{"type":"web_search_preview"}]})") == "tools[0].type");
  CHECK(refused(R"({"input":"x","tools":[{"type":"function","name":"f"}]})") == "tools");
  CHECK(refused(R"({"input":"x","tools":[{"type":"function"}],"tool_choice":"none"})") == "tools[0].name");
  CHECK(refused(R"({"input":"x","tool_choice":"required"})") == "tool_choice");
  CHECK(refused(R"({"input":"x","truncation":"middle"})") == "truncation");
  CHECK(refused(R"({"input":"x","metadata":{"k":1}})") == "metadata");
  CHECK(refused(R"({"input":"x","stream_options":{}})") == "stream_options");
  CHECK(refused(R"({"input":"x","max_output_tokens":0})") == "max_output_tokens");
  // Chat completions fields name their Responses counterpart.
  CHECK(refused(R"({"input":"x","messages":[]})") == "messages");
  CHECK(refused(R"({"input":"x","max_tokens":5})") == "max_tokens");
  CHECK(refused(R"({"input":"x","response_format":{"type":"text"}})") == "response_format");
  CHECK(refused(R"({"input":"x","n":2})") == "n");
  // What is served passes: text format, medium verbosity, an empty include, reasoning without settings.
  CHECK(refused(R"({"input":"x","text":{"format":{"type":"text"},"verbosity":"medium"},"include":[],"reasoning":{},
                    "background":false,"service_tier":"auto","top_logprobs":0})") == "(none)");
}

TEST_CASE("function tools: rendered with tool_choice none; auto and forced need tool calling; chat's nested shape") {
  const auto none = parse(R"({"input":"x","tool_choice":"none","tools":[{"type":"function","name":"get",
    "description":"d","parameters":{"type":"object"}}]})");
  CHECK(json::serialize(none.chat.at("tools")) ==
        R"([{"type":"function","function":{"name":"get","description":"d","parameters":{"type":"object"}}}])");
  CHECK(none.chat.at("tool_choice") == "none");
  CHECK(none.echo.at("tools").at(0).at("name") == "get");
  const ResponsesCapabilities tools{true, false};
  const auto named = parse(R"({"input":"x","tool_choice":{"type":"function","name":"get"},
    "tools":[{"type":"function","name":"get"}]})", tools);
  CHECK(json::serialize(named.chat.at("tool_choice")) == R"({"type":"function","function":{"name":"get"}})");
  CHECK(json::serialize(named.echo.at("tool_choice")) == R"({"type":"function","name":"get"})");
  CHECK(refused(R"({"input":"x","max_tool_calls":2})") == "(none)");
  CHECK(refused(R"({"input":"x","max_tool_calls":2})", tools) == "max_tool_calls");
  CHECK(refused(R"({"input":"x","tool_choice":{"type":"file_search"},"tools":[{"type":"function","name":"g"}]})", tools) ==
        "tool_choice.type");
  const ResponsesCapabilities structured{false, true};
  const auto schema = parse(R"({"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"},
    "strict":true}}})", structured);
  CHECK(json::serialize(schema.chat.at("response_format")) ==
        R"({"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"},"strict":true}})");
  CHECK(schema.echo.at("text").at("format").at("type") == "json_schema");
}

TEST_CASE("errors of the chat path name the Responses request's fields") {
  CHECK(responses_param("max_tokens") == "max_output_tokens");
  CHECK(responses_param("messages[2].content") == "input");
  CHECK(responses_param("response_format") == "text.format");
  CHECK(responses_param("temperature") == "temperature");
}

TEST_CASE("a chat completion becomes the response object; length is incomplete; tool calls are function_call items") {
  const auto text = response_from_chat(shell(), chunk(R"({"choices":[{"index":0,"finish_reason":"stop",
    "message":{"role":"assistant","content":"Hello"}}],"usage":{"prompt_tokens":5,"completion_tokens":2,
    "total_tokens":7,"prompt_tokens_details":{"cached_tokens":3}}})"));
  CHECK(text.at("id") == "resp_1");
  CHECK(text.at("object") == "response");
  CHECK(text.at("created_at") == 1700000000);
  CHECK(text.at("status") == "completed");
  CHECK(text.at("incomplete_details").is_null());
  const auto& item = text.at("output").at(0).as_object();
  CHECK(item.at("type") == "message");
  CHECK(item.at("role") == "assistant");
  CHECK(item.at("id") == "msg_1_0");  // the response's id (resp_1) and the output index
  CHECK(output_item_id("fc_", "resp_0123abcd", 2) == "fc_0123abcd_2");
  CHECK(item.at("content").at(0).at("type") == "output_text");
  CHECK(item.at("content").at(0).at("text") == "Hello");
  CHECK(item.at("content").at(0).at("annotations").as_array().empty());
  CHECK(json::serialize(text.at("usage")) ==
        R"({"input_tokens":5,"input_tokens_details":{"cached_tokens":3},"output_tokens":2,)"
        R"("output_tokens_details":{"reasoning_tokens":0},"total_tokens":7})");
  const auto cut = response_from_chat(shell(), chunk(R"({"choices":[{"finish_reason":"length",
    "message":{"role":"assistant","content":"Hel"}}]})"));
  CHECK(cut.at("status") == "incomplete");
  CHECK(cut.at("incomplete_details").at("reason") == "max_output_tokens");
  CHECK(cut.at("output").at(0).at("status") == "incomplete");
  const auto calls = response_from_chat(shell(), chunk(R"({"choices":[{"finish_reason":"tool_calls",
    "message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
    "function":{"name":"get","arguments":"{\"a\":1}"}}]}}]})"));
  CHECK(calls.at("status") == "completed");
  REQUIRE(calls.at("output").as_array().size() == 1);
  CHECK(calls.at("output").at(0).at("type") == "function_call");
  CHECK(calls.at("output").at(0).at("call_id") == "call_1");
  CHECK(calls.at("output").at(0).at("name") == "get");
  CHECK(calls.at("output").at(0).at("arguments") == R"({"a":1})");
}

TEST_CASE("a chat stream becomes the typed events in OpenAI's order, numbered from 0") {
  ResponsesEventStream s(shell());
  std::int64_t seq = 0;
  CHECK(event_types(s.begin(), seq) == std::vector<std::string>{"response.created", "response.in_progress"});
  CHECK(s.on_chunk(chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})")).empty());
  CHECK(event_types(s.on_chunk(chunk(R"({"choices":[{"delta":{"content":"Hel"},"finish_reason":null}]})")), seq) ==
        std::vector<std::string>{"response.output_item.added", "response.content_part.added", "response.output_text.delta"});
  CHECK(event_types(s.on_chunk(chunk(R"({"choices":[{"delta":{"content":"lo"},"finish_reason":"stop"}]})")), seq) ==
        std::vector<std::string>{"response.output_text.delta"});
  CHECK(s.on_chunk(chunk(R"({"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}})")).empty());
  CHECK(event_types(s.finish(), seq) ==
        std::vector<std::string>{"response.output_text.done", "response.content_part.done", "response.output_item.done",
                                 "response.completed"});
  const auto& r = s.final_response();
  CHECK(r.at("status") == "completed");
  CHECK(r.at("output").at(0).at("content").at(0).at("text") == "Hello");
  CHECK(r.at("usage").at("total_tokens") == 6);
  CHECK(!s.failed());
}

TEST_CASE("streamed tool calls are function_call items; an error ends the stream with error and response.failed") {
  ResponsesEventStream s(shell());
  std::int64_t seq = 0;
  event_types(s.begin(), seq);
  CHECK(event_types(s.on_chunk(chunk(R"({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",
    "function":{"name":"get","arguments":"{\"a\""}}]}}]})")), seq) ==
        std::vector<std::string>{"response.output_item.added", "response.function_call_arguments.delta"});
  event_types(s.on_chunk(chunk(R"({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},
    "finish_reason":"tool_calls"}]})")), seq);
  CHECK(event_types(s.finish(), seq) == std::vector<std::string>{"response.function_call_arguments.done",
                                                                 "response.output_item.done", "response.completed"});
  CHECK(s.final_response().at("output").at(0).at("arguments") == R"({"a":1})");

  ResponsesEventStream e(shell());
  seq = 0;
  event_types(e.begin(), seq);
  const std::string failed = e.on_chunk(chunk(R"({"error":{"message":"boom","type":"server_error"}})"));
  CHECK(event_types(failed, seq) == std::vector<std::string>{"error", "response.failed"});
  CHECK(failed.find(R"("message":"boom")") != std::string::npos);
  CHECK(e.failed());
  CHECK(e.final_response().at("status") == "failed");
  CHECK(e.finish().empty());

  ResponsesEventStream empty(shell());  // no text at all: still one (empty) message
  seq = 0;
  event_types(empty.begin(), seq);
  CHECK(event_types(empty.finish(), seq).size() == 6);
  CHECK(empty.final_response().at("output").at(0).at("content").at(0).at("text") == "");
}

TEST_CASE("reasoning_content becomes a reasoning item before the message, its text as content and summary") {
  const auto r = response_from_chat(shell(), chunk(R"({"choices":[{"finish_reason":"stop","message":{"role":"assistant",
    "content":"It is sunny.","reasoning_content":"The user wants the weather."}}]})"));
  const auto& output = r.at("output").as_array();
  REQUIRE(output.size() == 2);
  const auto& thought = output[0].as_object();
  CHECK(thought.at("type") == "reasoning");
  CHECK(thought.at("id") == "rs_1_0");
  CHECK(thought.at("status") == "completed");
  CHECK(json::serialize(thought.at("content")) == R"([{"type":"reasoning_text","text":"The user wants the weather."}])");
  CHECK(json::serialize(thought.at("summary")) == R"([{"type":"summary_text","text":"The user wants the weather."}])");
  CHECK(output[1].at("type") == "message");
  CHECK(output[1].at("id") == "msg_1_1");
  CHECK(output[1].at("content").at(0).at("text") == "It is sunny.");
  // Reasoning then a call: no empty message between them; the call's index follows the reasoning.
  const auto call = response_from_chat(shell(), chunk(R"({"choices":[{"finish_reason":"tool_calls","message":{
    "role":"assistant","content":null,"reasoning_content":"Look it up.","tool_calls":[{"id":"call_1","type":"function",
    "function":{"name":"get","arguments":"{}"}}]}}]})"));
  REQUIRE(call.at("output").as_array().size() == 2);
  CHECK(call.at("output").at(0).at("type") == "reasoning");
  CHECK(call.at("output").at(1).at("id") == "fc_1_1");
  // Cut while reasoning: the reasoning item alone, incomplete. No reasoning: no reasoning item.
  const auto cut = response_from_chat(shell(), chunk(R"({"choices":[{"finish_reason":"length","message":{
    "role":"assistant","content":"","reasoning_content":"Hmm"}}]})"));
  REQUIRE(cut.at("output").as_array().size() == 1);
  CHECK(cut.at("output").at(0).at("status") == "incomplete");
  const auto plain = response_from_chat(shell(), chunk(R"({"choices":[{"finish_reason":"stop","message":{
    "role":"assistant","content":"Hi","reasoning_content":""}}]})"));
  REQUIRE(plain.at("output").as_array().size() == 1);
  CHECK(plain.at("output").at(0).at("type") == "message");
}

TEST_CASE("streamed reasoning: a reasoning item with reasoning_text and reasoning_summary_text events, then the text") {
  ResponsesEventStream s(shell());
  std::int64_t seq = 0;
  event_types(s.begin(), seq);
  const std::string first = s.on_chunk(chunk(R"({"choices":[{"delta":{"reasoning_content":"The user"}}]})"));
  CHECK(event_types(first, seq) ==
        std::vector<std::string>{"response.output_item.added", "response.reasoning_summary_part.added",
                                 "response.content_part.added", "response.reasoning_summary_text.delta",
                                 "response.reasoning_text.delta"});
  CHECK(first.find(R"("item":{"id":"rs_1_0","type":"reasoning","status":"in_progress","summary":[],"content":[])") !=
        std::string::npos);
  CHECK(event_types(s.on_chunk(chunk(R"({"choices":[{"delta":{"reasoning_content":" asks."}}]})")), seq) ==
        std::vector<std::string>{"response.reasoning_summary_text.delta", "response.reasoning_text.delta"});
  const std::string text = s.on_chunk(chunk(R"({"choices":[{"delta":{"content":"Sunny."},"finish_reason":"stop"}]})"));
  CHECK(event_types(text, seq) ==
        std::vector<std::string>{"response.reasoning_text.done", "response.content_part.done",
                                 "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
                                 "response.output_item.done", "response.output_item.added", "response.content_part.added",
                                 "response.output_text.delta"});
  CHECK(text.find(R"("type":"response.reasoning_text.done","sequence_number":)") != std::string::npos);
  CHECK(text.find(R"("text":"The user asks.")") != std::string::npos);
  CHECK(text.find(R"("output_index":1,"item":{"id":"msg_1_1")") != std::string::npos);
  event_types(s.finish(), seq);
  const auto& output = s.final_response().at("output").as_array();
  REQUIRE(output.size() == 2);
  CHECK(output[0].at("summary").at(0).at("text") == "The user asks.");
  CHECK(output[0].at("content").at(0).at("text") == "The user asks.");
  CHECK(output[0].at("status") == "completed");
  CHECK(output[1].at("content").at(0).at("text") == "Sunny.");

  ResponsesEventStream cut(shell());  // cut while reasoning: the reasoning item closes, incomplete, and no message
  seq = 0;
  event_types(cut.begin(), seq);
  event_types(cut.on_chunk(chunk(R"({"choices":[{"delta":{"reasoning_content":"Hm"},"finish_reason":"length"}]})")), seq);
  CHECK(event_types(cut.finish(), seq).back() == "response.incomplete");
  REQUIRE(cut.final_response().at("output").as_array().size() == 1);
  CHECK(cut.final_response().at("output").at(0).at("status") == "incomplete");
}

TEST_CASE("the store keeps at most its entries and bytes, least recently used out first; items by id") {
  const auto entry = [](const char* item_id, std::size_t pad) {
    return StoredResponse{json::object{{"pad", std::string(pad, 'x')}},
                          json::array{json::object{{"id", item_id}, {"type", "message"}}}};
  };
  ResponseStore store({.max_entries = 2, .max_bytes = 1000});
  CHECK(store.put("a", entry("msg_a", 10)));
  CHECK(store.put("b", entry("msg_b", 10)));
  CHECK(store.get("a") != nullptr);  // a is now the most recent: b goes next
  CHECK(store.put("c", entry("msg_c", 10)));
  CHECK(store.size() == 2);
  CHECK(store.get("b") == nullptr);
  CHECK(!store.find_item("msg_b"));
  CHECK(store.find_item("msg_a")->at("type") == "message");
  CHECK(store.put("big", entry("msg_big", 900)));  // the bytes bound: both others go
  CHECK(store.size() == 1);
  CHECK(store.bytes() <= 1000);
  CHECK(!store.put("huge", entry("msg_h", 2000)));  // larger than the bound on its own: not kept
  CHECK(store.get("huge") == nullptr);
  CHECK(store.erase("big"));
  CHECK(!store.erase("big"));
  CHECK(store.size() == 0);
  CHECK(store.bytes() == 0);
  CHECK(!store.find_item("msg_big"));
}
